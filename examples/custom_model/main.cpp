// custom_model — a model written in the program itself (model.hpp: a hand-written 784-64-10
// ReLU network, no dtf::nn) trained by dtf::train. The strategy is the one line marked below:
// replace it with `const dtf::strategies::agn strategy({.window = 10});` (or any other
// built-in) and nothing else changes. --strategy picks one of two for the figures in docs/benchmarks.md.
//
//   dtfrun --ps 1 --workers 2 -- build/examples/custom_model                     # DOWNPOUR
//   dtfrun --ps 1 --workers 2 -- build/examples/custom_model --strategy agn      # AGN
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "model.hpp"

#include <cstdio>

template <class Strategy>
int run(dtf::train_flags& tf, const examples::fashion_mnist& data, Strategy strategy) {
  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  two_layer_net net(64);
  auto options = tf.options(cluster, "custom_model");
  options.evaluate = dtf::evaluate_on(net, data.test());
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
}

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  std::string which = "downpour";
  dtf::flag_parser flags("Trains a hand-written model (model.hpp) on Fashion-MNIST through parameter servers.");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("strategy", which, "downpour or agn");
  if (!flags.parse(argc, argv)) return 0;
  if (which == "downpour")  // the one line that picks the strategy:
    return run(tf, data, dtf::strategies::downpour({.local_rule = dtf::optim::sgd{0.05f}}));
  if (which == "agn") return run(tf, data, dtf::strategies::agn({.window = 10}));
  throw dtf::error(dtf::errc::invalid_config, "--strategy: '" + which + "' is neither downpour nor agn");
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_model: %s\n", e.what());
  return 2;
}
