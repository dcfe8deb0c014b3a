// The program of the fault test (test_fault.sh): the Fashion-MNIST MLP trained with
// asynchronous SGD (pull and push every step; Adagrad on the ps, so the checkpoints carry
// slots, at a rate decaying linearly with the task's progress through its epochs) through
// parameter servers inside a monitored_training_session, each task training --epochs passes
// over its shard, with the pieces that make a run survive SIGKILLed tasks under
// `dtfrun --max-restarts` and redo no work:
//   - the chief checkpoints every --save_every global steps (checkpoint_saver) into
//     --checkpoint_dir, and its session restores every ps from the latest checkpoint on start
//     (a restarted chief resumes from there);
//   - every ps call of a step (and of a save) runs under ps_recovery: a lost ps is reconnected;
//     the chief restores a restarted, empty ps from the latest checkpoint while the workers
//     wait for it; then the step runs again;
//   - every task reports its data position to ps 0 after each step (dtf/ps/positions.hpp); the
//     chief's checkpoints carry the positions and its restores give them back to a restarted ps;
//   - a restarted worker (or chief) waits for the ps, reads its position back and trains the
//     rest of its epochs from there, not from the start of its shard;
//   - with --examples_file PREFIX every start of a task keeps the count of examples it trained on
//     in PREFIX.<task>.<pid> (rewritten after each step), so the test can add up the work of
//     every process, killed ones included;
//   - with --ps_crash_at_restart K, the ps started for the K-th time SIGKILLs itself in the
//     middle of writing its next shard file (a crash during a save).
// Every task prints "pid=<pid>" first (the test's script kills tasks by pid) and progress lines
// with step= tokens. The chief prints the RESULT line with the final test accuracy.
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/ps/positions.hpp>
#include <dtf/recovery.hpp>
#include <dtf/session.hpp>
#include <dtf/strategies/async.hpp>

#include <algorithm>

#include "fault_job.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace {

// Asynchronous SGD through the ps: pull θ̃, compute g, push g; the ps applies Adagrad at a rate
// that decays linearly from lr to lr * final_fraction as the task goes through its epochs
// (*progress, in [0, 1]), so that the end of the run settles and its accuracy depends little on
// how the workers' pushes interleaved — nor on how far a restore set the global step back.
struct decayed_async_sgd_config {
  float learning_rate = 0.05f;
  float final_fraction = 0.1f;
  const double* progress = nullptr;
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
    const double done = std::clamp(*c_.progress, 0.0, 1.0);
    const float lr = c_.learning_rate * float(1.0 - (1.0 - c_.final_fraction) * done);
    w.pushed(w.ps.push_gradients(w.grads, lr));
    return loss;
  }
  void end(dtf::strategies::worker_state&) {}

 private:
  config_type c_;
};
static_assert(dtf::strategies::async_strategy<decayed_async_sgd>);

// The examples this process trained on, in a file of its own (rewritten in place after each step).
class examples_file {
 public:
  explicit examples_file(const std::string& path) {
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) throw dtf::error(dtf::errc::io_error, "cannot create " + path);
    write(0);
  }
  ~examples_file() {
    if (fd_ >= 0) ::close(fd_);
  }
  examples_file(const examples_file&) = delete;
  examples_file& operator=(const examples_file&) = delete;
  void write(std::uint64_t examples) const {
    if (fd_ < 0) return;
    char line[32];
    const int n = std::snprintf(line, sizeof line, "%20llu\n", static_cast<unsigned long long>(examples));
    if (::pwrite(fd_, line, std::size_t(n), 0) != n) throw dtf::error(dtf::errc::io_error, "cannot write the examples file");
  }

 private:
  int fd_ = -1;
};

}  // namespace

int main(int argc, char** argv) try {
  std::string checkpoint_dir, examples_prefix;
  std::int64_t save_every = 50;
  int keep = 3;
  float lr = 0.05f;
  std::int64_t crash_save_bytes = 100000;
  int crash_at_restart = -1;
  auto j = examples::job::setup(argc, argv, "fault_trainer", [&](dtf::flag_parser& f) {
    f.add("checkpoint_dir", checkpoint_dir, "where the chief saves checkpoints and restores from")
        .add("examples_file", examples_prefix,
             "each start of a task keeps the examples it trained on in PREFIX.<task>.<pid> (empty: none)")
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
  // This task's data and its place in it (the start, unless ps 0 holds a position for it).
  const std::uint64_t per_epoch = j->shard_batches(j->trainer);
  const std::uint64_t total_batches = per_epoch * std::uint64_t(j->epochs);
  const auto train = j->train_shard(j->epochs);
  dtf::data::position at = dtf::data::position::start_of(j->trainers, train.size(), std::uint64_t(j->batch),
                                                         j->seed + j->trainer);
  double progress = 0;
  dtf::strategies::async_worker<decayed_async_sgd, dtf::nn::sequential> worker(
      decayed_async_sgd({.learning_rate = lr, .final_fraction = 0.1f, .progress = &progress}), j->net, ps, j->trainer,
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
  std::printf("%s: session created at step=%lld\n", j->me().c_str(), static_cast<long long>(sess.global_step()));
  std::fflush(stdout);
  if (const auto recorded = recovery.run([&] { return dtf::recorded_position(ps); })) {
    if (const auto why = recorded->unusable_in(at, per_epoch))
      std::printf("%s: not resuming the recorded data position (%s); starting the shard over\n", j->me().c_str(),
                  why->c_str());
    else
      at = *recorded;
  }
  std::printf("%s: data position epoch=%llu batch=%llu examples_before=%llu of %d epochs\n", j->me().c_str(),
              static_cast<unsigned long long>(at.epoch), static_cast<unsigned long long>(at.batch),
              static_cast<unsigned long long>(at.examples), j->epochs);
  std::fflush(stdout);
  const examples_file counter(examples_prefix.empty() ? std::string()
                                                      : examples_prefix + "." + j->me() + "." +
                                                            std::to_string(::getpid()));
  worker.begin();
  auto stream = train.stream(at);
  double loss_sum = 0;
  std::int64_t runs = 0;
  std::uint64_t examples = 0;  // by this process
  while (!sess.should_stop()) {
    const auto b = stream.next();
    if (!b) break;
    progress = double(at.steps) / double(std::max<std::uint64_t>(1, total_batches));
    sess.run([&](dtf::run_context&) {
      const float loss = recovery.run([&] { return worker.step(*b); });
      at.trained(b->epoch, b->index, b->labels.size(), per_epoch);
      examples += b->labels.size();
      counter.write(examples);
      recovery.run([&] { dtf::report_position(ps, at); });
      loss_sum += loss;
      if (++runs % j->log_every == 0) {
        std::printf("%s: step=%lld epoch=%llu loss=%.4f\n", j->me().c_str(), static_cast<long long>(worker.global_step()),
                    static_cast<unsigned long long>(at.epoch), loss_sum / double(j->log_every));
        std::fflush(stdout);
        loss_sum = 0;
      }
      return dtf::run_values{.global_step = worker.global_step(), .loss = loss, .examples = b->labels.size()};
    });
  }
  sess.close();
  worker.end();
  std::printf("%s: trained examples=%llu in this run (%llu of its shard's %llu in all)\n", j->me().c_str(),
              static_cast<unsigned long long>(examples), static_cast<unsigned long long>(at.examples),
              static_cast<unsigned long long>(train.size() * std::uint64_t(j->epochs)));
  std::fflush(stdout);
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
