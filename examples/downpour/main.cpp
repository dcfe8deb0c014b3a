// downpour — DOWNPOUR SGD (Dean et al. 2012): local SGD steps, accumulated gradients pushed
// every window to a ps that applies Adagrad.
//   dtfrun --ps 1 --workers 2 -- build/examples/downpour
// The same binary runs as ps, worker or chief; dtf::train does the rest (dtf/train.hpp).
#include <dtf/dtf.hpp>
#include <dtf/strategies/downpour.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  int fetch_every = 5, push_every = 5;
  float local_lr = 0.01f, ps_lr = 0.05f;
  bool staleness_aware = true;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with downpour through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("fetch_every", fetch_every, "steps between pulls")
      .add("push_every", push_every, "steps between pushes")
      .add("local_lr", local_lr, "rate of the worker's local SGD steps")
      .add("ps_lr", ps_lr, "rate of the Adagrad the ps applies")
      .add("staleness_aware", staleness_aware, "divide each push's rate by its staleness + 1 (false: the plain scheme)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  dtf::strategies::downpour strategy({.fetch_every = std::size_t(fetch_every),
                                            .push_every = std::size_t(push_every),
                                            .local_rule = dtf::optim::sgd{local_lr},
                                            .ps_rule = dtf::optim::adagrad{ps_lr},
                                            .staleness_aware = staleness_aware});
  auto options = tf.options(cluster, "downpour");
  options.evaluate = dtf::evaluate_on(net, data.test());
  options.learning_rate = [&](std::int64_t, std::size_t) { return double(local_lr); };
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "downpour: %s\n", e.what());
  return 2;
}
