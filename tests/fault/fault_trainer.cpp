// The program of the fault test (test_fault.sh): the Fashion-MNIST MLP trained with
// asynchronous SGD (pull and push every step; Adagrad on the ps, so the checkpoints carry
// slots, at a linearly decaying rate) through parameter servers inside a
// monitored_training_session, with the pieces that make a run
// survive SIGKILLed tasks under `dtfrun --max-restarts`:
//   - the chief checkpoints every --save_every global steps (checkpoint_saver) into
//     --checkpoint_dir, and its session restores every ps from the latest checkpoint on start
//     (a restarted chief resumes from there);
//   - every ps call of a step (and of a save) runs under ps_recovery: a lost ps is reconnected;
//     the chief restores a restarted, empty ps from the latest checkpoint while the workers
//     wait for it; then the step runs again;
//   - a restarted worker waits for the ps and trains on until the global step reaches
//     --last_step, like the others;
//   - with --ps_crash_at_restart K, the ps started for the K-th time SIGKILLs itself in the
//     middle of writing its next shard file (a crash during a save).
// Every task prints "pid=<pid>" first (the test's script kills tasks by pid) and progress lines
// with step= tokens. The chief prints the RESULT line with the final test accuracy.
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/hooks/stop_at_step.hpp>
#include <dtf/recovery.hpp>
#include <dtf/session.hpp>
#include <dtf/strategies/async.hpp>

#include <algorithm>

#include "fault_job.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace {

// Asynchronous SGD through the ps: pull θ̃, compute g, push g; the ps applies Adagrad at a rate
// that decays linearly from lr to lr * final_fraction at last_step, so that the end of the run
// settles and its accuracy depends little on how the workers' pushes interleaved.
struct decayed_async_sgd_config {
  float learning_rate = 0.05f;
  float final_fraction = 0.1f;
  std::int64_t last_step = 1;
};
class decayed_async_sgd {
 public:
  using config_type = decayed_async_sgd_config;
  explicit decayed_async_sgd(config_type c) : c_(c) {}
  dtf::optim::rule ps_rule() const { return dtf::optim::adagrad{c_.learning_rate}; }
  bool lock_free() const { return false; }
  void begin(dtf::strategies::worker_state&) {}
  float step(dtf::strategies::worker_state& w, const dtf::strategies::gradient_fn& grad) {
    w.global_step = w.ps.pull(w.params);
    const float loss = grad(w.params, w.grads);
    const double done = std::clamp(double(w.global_step) / double(std::max<std::int64_t>(1, c_.last_step)), 0.0, 1.0);
    const float lr = c_.learning_rate * float(1.0 - (1.0 - c_.final_fraction) * done);
    w.pushed(w.ps.push_gradients(w.grads, lr));
    return loss;
  }
  void end(dtf::strategies::worker_state&) {}

 private:
  config_type c_;
};
static_assert(dtf::strategies::async_strategy<decayed_async_sgd>);

}  // namespace

int main(int argc, char** argv) try {
  std::string checkpoint_dir;
  std::int64_t last_step = 600, save_every = 50;
  int keep = 3;
  float lr = 0.05f;
  std::int64_t crash_save_bytes = 100000;
  int crash_at_restart = -1;
  auto j = examples::job::setup(argc, argv, "fault_trainer", [&](dtf::flag_parser& f) {
    f.add("checkpoint_dir", checkpoint_dir, "where the chief saves checkpoints and restores from")
        .add("last_step", last_step, "every task trains until the global step reaches this")
        .add("save_every", save_every, "chief: global steps between checkpoints")
        .add("keep", keep, "checkpoints kept")
        .add("lr", lr, "Adagrad's learning rate on the ps")
        .add("ps_crash_at_restart", crash_at_restart,
             "ps: the start with DTF_RESTART_COUNT=K SIGKILLs itself part-way through its first save (-1: never)")
        .add("ps_crash_save_bytes", crash_save_bytes, "ps: bytes of its shard file written before that crash");
  });
  if (!j) return 0;
  const char* restarts = std::getenv("DTF_RESTART_COUNT");
  std::printf("%s: pid=%d restart=%s\n", j->me().c_str(), int(::getpid()), restarts ? restarts : "0");
  std::fflush(stdout);
  if (j->is_ps()) {
    dtf::ps_options o{j->transport};
    o.checkpoint_dir = checkpoint_dir;  // the ps writes its shard files only there
    if (crash_at_restart >= 0 && std::atoi(restarts ? restarts : "0") == crash_at_restart) {
      o.save_fault = {.abort_after_bytes = std::uint64_t(crash_save_bytes), .kill_process = true};
      std::printf("%s: will crash (SIGKILL) after writing %lld bytes of its next shard file\n", j->me().c_str(),
                  static_cast<long long>(crash_save_bytes));
    }
    dtf::parameter_server ps(j->cluster.spec.address(j->cluster.self), o);
    std::printf("%s: serving\n", j->me().c_str());
    std::fflush(stdout);
    ps.run();
    std::printf("%s: shut down by the chief at global step %lld; exiting\n", j->me().c_str(),
                static_cast<long long>(ps.global_step()));
    return 0;
  }
  if (checkpoint_dir.empty()) throw dtf::error(dtf::errc::invalid_config, "--checkpoint_dir is required");

  const auto client = j->connect();
  auto& ps = *client;
  dtf::strategies::async_worker<decayed_async_sgd, dtf::nn::sequential> worker(
      decayed_async_sgd({.learning_rate = lr, .final_fraction = 0.1f, .last_step = last_step}), j->net, ps, j->trainer,
      j->trainers);
  const auto vars = j->net.variables();
  const auto rule = worker.strategy().ps_rule();

  auto restore_or_init = [&] {
    if (!restore_latest(ps, checkpoint_dir, vars, {rule})) worker.initialize_ps(j->seed);
  };
  dtf::ps_recovery recovery(ps, j->is_chief(), restore_or_init,
                            {.ready_timeout = std::chrono::milliseconds(j->timeout_ms),
                             .log = [](const std::string& l) {
                               std::printf("%s\n", l.c_str());
                               std::fflush(stdout);
                             }},
                            [&] { worker.begin(); });

  dtf::monitored_training_session sess(
      {.is_chief = j->is_chief(),
       .scaffold = dtf::ps_scaffold(ps, {.checkpoint_dir = checkpoint_dir,
                                         .variables = vars,
                                         .config = {rule},
                                         .init = [&] { worker.initialize_ps(j->seed); },
                                         .ready_timeout = std::chrono::milliseconds(j->timeout_ms)})});
  sess.add_hook(dtf::hooks::stop_at_step({.last_step = last_step}));
  const dtf::checkpoint_options ck{checkpoint_dir, "ckpt", std::size_t(keep)};
  sess.add_chief_hook(dtf::hooks::checkpoint_saver(
      // Named after ps 0's global step at the save (after a restore it may be behind the session's).
      [&](std::int64_t) { return recovery.run([&] { return save_checkpoint(ps, ck, vars); }); },
      {.every_n_steps = save_every,
       .every_secs = 0,
       .listeners = {{.after_save = [&](std::int64_t step, const dtf::checkpoint_manifest& m) {
         std::printf("%s: saved checkpoint %s (global step %lld) at step=%lld\n", j->me().c_str(), m.name.c_str(),
                     static_cast<long long>(m.global_step), static_cast<long long>(step));
         std::fflush(stdout);
         return false;
       }}}}));
  sess.create();
  std::printf("%s: session created at step=%lld last_step=%lld\n", j->me().c_str(),
              static_cast<long long>(sess.global_step()), static_cast<long long>(last_step));
  std::fflush(stdout);
  worker.begin();
  const auto train = j->train_shard(-1);
  auto stream = train.stream();
  double loss_sum = 0;
  std::int64_t runs = 0;
  sess.train([&](dtf::run_context& ctx) {
    const auto b = stream.next();
    const float loss = recovery.run([&] { return worker.step(*b); });
    loss_sum += loss;
    if (++runs % j->log_every == 0) {
      std::printf("%s: step=%lld last_step=%lld loss=%.4f\n", j->me().c_str(),
                  static_cast<long long>(worker.global_step()), static_cast<long long>(last_step),
                  loss_sum / double(j->log_every));
      std::fflush(stdout);
      loss_sum = 0;
    }
    (void)ctx;
    return dtf::run_values{.global_step = worker.global_step(), .loss = loss, .examples = b->labels.size()};
  });
  std::printf("%s: stopped at step=%lld after %lld runs; %d recoveries\n", j->me().c_str(),
              static_cast<long long>(sess.global_step()), static_cast<long long>(runs), recovery.recoveries());
  std::fflush(stdout);
  return recovery.run([&] {
    return j->finish(ps, "recoveries=" + std::to_string(recovery.recoveries()) +
                             " reinitialisations=" + std::to_string(recovery.reinitialisations()));
  });
} catch (const std::exception& e) {
  std::fprintf(stderr, "fault_trainer: %s\n", e.what());
  return 2;
}
