// non_distributed — trains the 784-256-128-10 MLP on Fashion-MNIST in one process: the
// baseline every distributed scheme is compared with. It is dtf::train with ring_allreduce on
// a cluster of this process alone: one rank, so plain minibatch training with the standard
// session (step limits, NaN check, progress lines, --model_dir checkpoints and summaries,
// SIGTERM/SIGINT as a clean stop).
//
//   build/examples/non_distributed --epochs 5
//   build/examples/non_distributed --epochs 5 --model_dir run0    # then: tensorboard --logdir run0
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  tf.blas_threads = 0;
  examples::fashion_mnist data;
  std::string optimizer = "adam";
  float lr = 1e-3f;
  dtf::flag_parser flags("Trains a 784-256-128-10 MLP on Fashion-MNIST in one process.");
  tf.add_to(flags, dtf::train_flag_set::collective);
  data.add_to(flags);
  flags.add("lr", lr, "learning rate")
      .add("optimizer", optimizer, "sgd, momentum, nesterov, adagrad or adam")
      .add("device_threads", tf.device_threads, "OpenMP threads of Thrust's device system on CPU builds");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  dtf::strategies::ring_allreduce<> strategy({.rule = tf.rule(optimizer, lr)});
  auto options = tf.options(cluster, "non_distributed");
  options.evaluate = dtf::evaluate_on(net, data.test());
  return dtf::train(cluster, net, train, std::move(strategy), options).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "non_distributed: %s\n", e.what());
  return 2;
}
