// sync_sgd — synchronous SGD through parameter servers (SyncReplicasOptimizer semantics, with
// stale gradients counted): N of the workers' gradients averaged per step; with more workers
// than N the extra ones are backups.
//   dtfrun --ps 1 --workers 2 -- build/examples/sync_sgd
//   dtfrun --ps 1 --workers 3 -- build/examples/sync_sgd --replicas_to_aggregate 2   # one backup
#include "../common/sync_main.hpp"

int main(int argc, char** argv) {
  int n = 0, warmup = 100;
  float lr = 1e-3f;
  std::string optimizer = "adam";
  bool linear_scaling = true;
  std::size_t replicas = 1;
  return examples::sync_main<dtf::strategies::sync_sgd>(
      argc, argv, "sync_sgd",
      [&](dtf::flag_parser& f) {
        f.add("replicas_to_aggregate", n, "N: gradients averaged per step (0: every worker)")
            .add("optimizer", optimizer, "the ps's rule: sgd, momentum, nesterov, adagrad or adam")
            .add("lr", lr, "base rate of the ps's rule (tuned for one worker's batch)")
            .add("linear_scaling", linear_scaling, "scale the rate by N (Goyal et al. 2017); --nolinear_scaling: off")
            .add("warmup_steps", warmup, "ramp from lr to N*lr over this many steps (with --linear_scaling)");
      },
      [&](std::size_t workers) {
        replicas = n > 0 ? std::size_t(n) : workers;
        return dtf::strategies::sync_sgd({.replicas_to_aggregate = replicas,
                                          .rule = dtf::optim::make_rule(optimizer, lr),
                                          .linear_scaling = linear_scaling,
                                          .warmup_steps = warmup});
      },
      {.learning_rate = [&](std::int64_t step, std::size_t) {
        if (!linear_scaling) return double(lr);
        return double(dtf::optim::linear_scaling_warmup{.base_rate = lr, .scale = float(replicas), .warmup_steps = warmup}(step));
      }});
}
