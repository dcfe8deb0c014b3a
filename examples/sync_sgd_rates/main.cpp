// sync_sgd_rates — synchronous SGD where each worker scales its contribution by a rate of its
// own (the TF guide's "Synchronous-SGD-different-learning-rates"); the ps applies momentum
// with rate 1 to the average of the scaled gradients.
//   dtfrun --ps 1 --workers 2 -- build/examples/sync_sgd_rates --worker_rates 0.1,0.05
// Default 8 epochs: momentum SGD at these rates needs more than the 5 that Adam needs.
// The same binary runs as ps, worker or chief; dtf::train does the rest (dtf/train.hpp).
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  tf.train.epochs = 8;
  std::string rates = "0.1,0.05";
  float momentum = 0.9f;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with sync_sgd_rates through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("worker_rates", rates, "comma-separated rates; worker k uses the k-th (cycled)")
      .add("momentum", momentum, "momentum of the ps's rule");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  dtf::strategies::sync_sgd strategy({.replicas_to_aggregate = dtf::num_trainers(cluster),
                                            .rule = dtf::optim::momentum{1.0f, momentum},
                                            .worker_rates = examples::parse_floats(rates, "worker_rates")});
  auto options = tf.options(cluster, "sync_sgd_rates");
  options.evaluate = dtf::evaluate_on(net, data.test());
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sync_sgd_rates: %s\n", e.what());
  return 2;
}
