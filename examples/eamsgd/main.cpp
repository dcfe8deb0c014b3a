// eamsgd — Elastic Averaging SGD with Nesterov momentum on the workers (Zhang et al. 2015).
//   dtfrun --ps 1 --workers 2 -- build/examples/eamsgd
// The same binary runs as ps, worker or chief; dtf::train does the rest (dtf/train.hpp).
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  dtf::strategies::eamsgd_config c;
  int window = int(c.window);
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with eamsgd through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("window", window, "τ: local steps between elastic updates")
      .add("lr", c.learning_rate, "η: local rate")
      .add("momentum", c.momentum, "μ: Nesterov momentum")
      .add("rho", c.rho, "ρ: elasticity (α = η ρ)")
      .add("beta", c.beta, "β: with staleness_aware, α = min(η ρ, β / workers)")
      .add("staleness_aware", c.staleness_aware, "α = min(η ρ, β / workers) (false: α = η ρ at any worker count)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  c.window = std::size_t(window);
  dtf::strategies::eamsgd strategy(c);
  auto options = tf.options(cluster, "eamsgd");
  options.evaluate = dtf::evaluate_on(net, data.test());
  options.learning_rate = [&](std::int64_t, std::size_t) { return double(c.learning_rate); };
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "eamsgd: %s\n", e.what());
  return 2;
}
