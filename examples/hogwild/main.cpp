// hogwild — lock-free SGD on the parameter server (Niu et al. 2011).
//   dtfrun --ps 1 --workers 2 -- build/examples/hogwild
// The same binary runs as ps, worker or chief; dtf::train does the rest (dtf/train.hpp).
#include <dtf/dtf.hpp>
#include <dtf/strategies/hogwild.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  dtf::strategies::hogwild_config c;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with hogwild through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("lr", c.learning_rate, "SGD step size the ps applies")
      .add("epoch_decay", c.epoch_decay, "per-epoch step-size factor")
      .add("staleness_aware", c.staleness_aware, "divide each push's rate by its staleness + 1 (false: the plain scheme)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  auto options = tf.options(cluster, "hogwild");
  options.evaluate = dtf::evaluate_on(net, data.test());
  options.learning_rate = [&](std::int64_t, std::size_t epoch) {
    return double(c.learning_rate) * std::pow(double(c.epoch_decay), double(epoch));
  };
  return dtf::train(cluster, net, train, dtf::strategies::hogwild(c), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "hogwild: %s\n", e.what());
  return 2;
}
