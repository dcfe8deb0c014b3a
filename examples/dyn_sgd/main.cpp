// dyn_sgd — DynSGD (Jiang et al. 2017): windowed local steps whose residual the ps scales by
// 1/(staleness + 1).
//   dtfrun --ps 1 --workers 2 -- build/examples/dyn_sgd
// The same binary runs as ps, worker or chief; dtf::train does the rest (dtf/train.hpp).
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  int window = 5;
  float lr = 1e-3f;
  std::string optimizer = "adam";
  bool staleness_aware = true;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with dyn_sgd through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("window", window, "local steps per commit")
      .add("lr", lr, "local learning rate")
      .add("optimizer", optimizer, "local optimiser: sgd, momentum, nesterov, adagrad or adam")
      .add("staleness_aware", staleness_aware, "scale each commit by 1 / (staleness + 1) on the ps (false: add it whole)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  dtf::strategies::dyn_sgd strategy({std::size_t(window), tf.rule(optimizer, lr), staleness_aware});
  auto options = tf.options(cluster, "dyn_sgd");
  options.evaluate = dtf::evaluate_on(net, data.test());
  options.learning_rate = [&](std::int64_t, std::size_t) { return double(lr); };
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dyn_sgd: %s\n", e.what());
  return 2;
}
