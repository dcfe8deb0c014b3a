// sync_sgd — synchronous SGD through parameter servers (SyncReplicasOptimizer semantics, with
// stale gradients counted): N of the workers' gradients averaged per step; with more workers
// than N the extra ones are backups.
//   dtfrun --ps 1 --workers 2 -- build/examples/sync_sgd
//   dtfrun --ps 1 --workers 3 -- build/examples/sync_sgd --replicas_to_aggregate 2   # one backup
// The same binary runs as ps, worker or chief; dtf::train does the rest (dtf/train.hpp).
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  int n = 0, warmup = 100;
  float lr = 1e-3f;
  std::string optimizer = "adam";
  bool linear_scaling = true;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP with sync_sgd through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("replicas_to_aggregate", n, "N: gradients averaged per step (0: every worker)")
      .add("optimizer", optimizer, "the ps's rule: sgd, momentum, nesterov, adagrad or adam")
      .add("lr", lr, "base rate of the ps's rule (tuned for one worker's batch)")
      .add("linear_scaling", linear_scaling, "scale the rate by N (Goyal et al. 2017); --nolinear_scaling: off")
      .add("warmup_steps", warmup, "ramp from lr to N*lr over this many steps (with --linear_scaling)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  const std::size_t replicas = n > 0 ? std::size_t(n) : dtf::num_trainers(cluster);
  const dtf::strategies::sync_sgd_config config{.replicas_to_aggregate = replicas,
                                                .rule = tf.rule(optimizer, lr),
                                                .linear_scaling = linear_scaling,
                                                .warmup_steps = warmup};
  dtf::strategies::sync_sgd strategy(config);
  auto options = tf.options(cluster, "sync_sgd");
  options.evaluate = dtf::evaluate_on(net, data.test());
  options.learning_rate = [&](std::int64_t step, std::size_t) {
    return double(dtf::strategies::sync_rate(config, step).value_or(lr));
  };
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sync_sgd: %s\n", e.what());
  return 2;
}
