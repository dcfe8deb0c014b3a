// agn — Accumulated Gradient Normalization (Hermans 2017): λ local Adam steps, then the
// window's mean update is committed to the ps.
//   dtfrun --ps 1 --workers 2 -- build/examples/agn
// The same binary runs as ps, worker or chief; dtf::train does the rest (dtf/train.hpp).
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  int window = 10;
  float lr = 1e-3f;
  std::string optimizer = "adam";
  bool staleness_aware = true;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with agn through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("window", window, "λ: local steps per commit")
      .add("lr", lr, "local learning rate")
      .add("optimizer", optimizer, "local optimiser: sgd, momentum, nesterov, adagrad or adam")
      .add("staleness_aware", staleness_aware, "normalise each commit by its window's steps (false: the raw residual)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  dtf::strategies::agn strategy({std::size_t(window), tf.rule(optimizer, lr), staleness_aware});
  auto options = tf.options(cluster, "agn");
  options.evaluate = dtf::evaluate_on(net, data.test());
  options.learning_rate = [&](std::int64_t, std::size_t) { return double(lr); };
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "agn: %s\n", e.what());
  return 2;
}
