// downpour_easy — the TensorFlow guide's DOWNPOUR-Easy: plain local SGD at a rate of each
// worker's own (--local_rates, one per worker, cycled), Adagrad on the ps.
//   dtfrun --ps 1 --workers 2 -- build/examples/downpour_easy --local_rates 0.02,0.01
// The same binary runs as ps, worker or chief; dtf::train does the rest (dtf/train.hpp).
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  std::string rates = "0.02,0.01";
  float ps_lr = 0.05f;
  int window = 5;
  bool staleness_aware = true;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with downpour_easy through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("local_rates", rates, "comma-separated local SGD rates; worker k uses the k-th (cycled)")
      .add("ps_lr", ps_lr, "rate of the Adagrad the ps applies")
      .add("window", window, "steps between pulls and between pushes")
      .add("staleness_aware", staleness_aware, "divide each push's rate by its staleness + 1 (false: the plain scheme)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  auto config = dtf::strategies::downpour_easy_config(examples::parse_floats(rates, "local_rates"), ps_lr);
  config.fetch_every = config.push_every = std::size_t(window);
  config.staleness_aware = staleness_aware;
  dtf::strategies::downpour strategy(config);
  auto options = tf.options(cluster, "downpour_easy");
  options.evaluate = dtf::evaluate_on(net, data.test());
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "downpour_easy: %s\n", e.what());
  return 2;
}
