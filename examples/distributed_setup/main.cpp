// distributed_setup — the plainest distributed program: asynchronous SGD through parameter
// servers with a strategy written here (pull θ̃, compute g on this worker's batch, push g; the
// ps applies the update rule, Adam by default). The same binary runs as a ps, a worker or the
// chief (worker 0 without a chief task); dtf::train does the rest: the chief initialises or
// restores from --model_dir, checkpoints, evaluates, ends the job; the ps exit 0 (dtf/train.hpp).
//
//   dtfrun --ps 1 --workers 1 -- build/examples/distributed_setup
//   dtfrun --ps 1 --workers 2 -- build/examples/distributed_setup --model_dir run1   # rerun: resumes
//   build/examples/distributed_setup --job_name ps --task_index 0 --ps_hosts h0:2222 --worker_hosts h1:2222
#include <dtf/dtf.hpp>

#include "../common/fashion_mnist.hpp"
#include "../common/mlp.hpp"

#include <cstdio>

// A strategy of the program's own (dtf::strategy, asynchronous): one pull and one push per step.
struct pull_compute_push {
  using config_type = dtf::optim::rule;
  using state_type = dtf::strategies::worker_state;
  static constexpr dtf::strategy_kind kind = dtf::strategy_kind::asynchronous;
  config_type rule;
  dtf::optim::rule ps_rule() const { return rule; }
  bool lock_free() const { return false; }
  void begin(state_type&) {}
  float step(state_type& w, const dtf::strategies::gradient_fn& gradient) {
    w.ps.pull(w.params);
    const float loss = gradient(w.params, w.grads);
    w.pushed(w.ps.push_gradients(w.grads));
    return loss;
  }
  void end(state_type&) {}
};
static_assert(dtf::check_strategy<pull_compute_push>());

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  examples::fashion_mnist data;
  std::string optimizer = "adam";
  float lr = 1e-3f;
  dtf::flag_parser flags("Trains the Fashion-MNIST MLP through parameter servers (one process per task).");
  tf.add_to(flags);
  data.add_to(flags);
  flags.add("lr", lr, "learning rate of the update rule the ps applies")
      .add("optimizer", optimizer, "update rule on the ps: sgd, momentum, nesterov, adagrad or adam");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto train = data.train();
  auto net = examples::make_mlp();
  auto options = tf.options(cluster, "distributed_setup");
  options.evaluate = dtf::evaluate_on(net, data.test());
  options.learning_rate = [&](std::int64_t, std::size_t) { return double(lr); };
  options.result_extra = "optimizer=" + optimizer;
  pull_compute_push strategy{tf.rule(optimizer, lr)};
  return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()).exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "distributed_setup: %s\n", e.what());
  return 2;
}
