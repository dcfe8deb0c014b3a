// torch_cnn — a convolutional network written with LibTorch's modules (convolution, BatchNorm,
// ReLU, pooling, dropout, linear; cnn.hpp) made a dtf model by dtf::libtorch::module_model, trained
// on Fashion-MNIST by a dtf strategy:
//   dtfrun --ps 1 --workers 2 -- build/examples/torch_cnn --strategy downpour   (or sync_sgd)
//   dtfrun --workers 2 -- build/examples/torch_cnn --strategy ring_allreduce
#include <dtf/dtf.hpp>
#include <dtf/torch/module_model.hpp>

#include "../common/fashion_mnist.hpp"
#include "cnn.hpp"

#include <cstdio>
#include <string>

template <class MakeStrategy>  // strategy = make(cluster)
int run(dtf::train_flags& tf, const examples::fashion_mnist& data, MakeStrategy make, const std::string& name) {
  const dtf::cluster cluster = tf.resolve_cluster();
  dtf::libtorch::module_model<examples::Cnn> net(
      examples::Cnn(), {.input_shape = {1, 28, 28}, .threads = tf.blas_threads, .seed = tf.train.seed,
                        .task = dtf::trainer_index(cluster)});
  auto options = tf.options(cluster, name);
  options.evaluate = dtf::evaluate_on(net, data.test());
  return dtf::train(cluster, net, data.train(), make(cluster), options, tf.partitioner()).exit_code;
}

int main(int argc, char** argv) try {
  std::string strategy = "downpour";  // the --strategy flag's value decides the flag set, so look first
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--strategy") strategy = argv[i + 1];
  const bool collective = strategy == "ring_allreduce";
  dtf::train_flags tf;
  tf.train.epochs = 5;
  examples::fashion_mnist data;
  float lr = 1e-3f;
  bool overlap = true;
  dtf::flag_parser flags("Trains a LibTorch CNN on Fashion-MNIST with a dtf strategy (one process per task).");
  tf.add_to(flags, collective ? dtf::train_flag_set::collective : dtf::train_flag_set::ps);
  data.add_to(flags);
  flags.add("strategy", strategy, "downpour, sync_sgd or ring_allreduce").add("lr", lr, "rate of the Adam update");
  if (collective) flags.add("overlap", overlap, "ring: reduce gradients while backprop runs; --nooverlap: after it");
  if (!flags.parse(argc, argv)) return 0;

  namespace s = dtf::strategies;  // the strategy line: Adam on the ps (DOWNPOUR: a push and a pull every step)
  if (strategy == "downpour")
    return run(tf, data, [&](auto&) { return s::downpour({1, 1, dtf::optim::sgd{lr}, dtf::optim::adam{lr}}); },
               strategy);
  if (strategy == "sync_sgd")
    return run(tf, data, [&](auto& c) { return s::sync_sgd({dtf::num_trainers(c), dtf::optim::adam{lr}}); }, strategy);
  if (collective)
    return run(tf, data, [&](auto&) { return s::ring_allreduce<>({.rule = dtf::optim::adam{lr}, .overlap = overlap}); },
               strategy);
  std::fprintf(stderr, "torch_cnn: --strategy: '%s' is not downpour, sync_sgd or ring_allreduce\n", strategy.c_str());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "torch_cnn: %s\n", e.what());
  return 2;
}
