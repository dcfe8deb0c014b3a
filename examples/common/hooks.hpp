// The standard session of every parameter-server example: common flags, the standard hooks
// and SIGTERM/SIGINT turned into a stop request — one place instead of set-up copied into
// each example.
//
// Flags (added to every example by async_main / sync_main, distributed_setup; the single-process
// non_distributed gets the subset without checkpoints and recovery through local_session; the
// collective examples ring_allreduce and mirrored all but --max_recoveries through
// collective_session, whose checkpoints rank 0 writes itself, see there):
//   --model_dir DIR                checkpoints and TensorBoard event files (empty: neither)
//   --save_checkpoints_steps N     chief: a checkpoint every N global steps (0: not by steps)
//   --save_checkpoints_secs S      chief: a checkpoint every S seconds (0: not by time)
//   --keep_checkpoints K           checkpoints kept (max_to_keep; 0: all)
//   --last_step N / --num_steps N  stop at global step N / after N more global steps
//   --summary_every N              chief: TensorBoard summaries every N global steps (0: none)
//   --nan_policy fail|stop         a NaN or infinite loss fails the task, or stops it cleanly
//   --max_recoveries N             carry on after a lost ps up to N times (0: a lost ps ends the
//                                  task); for dtfrun --max-restarts (dtf/recovery.hpp)
// Progress lines come from the logging hook every --log_every global steps (job.hpp's flag)
// and carry dtfrun's key=value tokens (step=, last_step=, loss=, steps_per_sec=).
//
// With --model_dir the chief restores every ps from the latest checkpoint there when one
// exists (so rerunning the same command resumes), saves at the start, on the schedule above and
// at the end, and writes summaries: loss, learning rate (when the example knows it), global
// steps/s, examples/s, the example's own scalars (staleness, dropped gradients) and a
// histogram per variable. `tensorboard --logdir DIR` shows them.
//
// Signals: the first SIGTERM or SIGINT requests a stop: the step in progress completes, the
// chief saves a checkpoint and ends the job at once (evaluation, RESULT line, ps shutdown,
// without waiting for the other workers, which then lose their parameter servers); another
// worker ends its part. A second signal ends the process at once with the default action.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/collectives.hpp>
#include <dtf/hooks.hpp>
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/recovery.hpp>
#include <dtf/session.hpp>
#include <dtf/summary.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>

#include "job.hpp"

#include <atomic>
#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

namespace examples {

struct hook_flags {
  std::string model_dir;
  std::int64_t save_checkpoints_steps = 0;
  double save_checkpoints_secs = 600;
  int keep_checkpoints = 5;
  std::int64_t last_step = 0, num_steps = 0;
  int summary_every = 100;
  std::string nan_policy = "fail";
  int max_recoveries = 0;

  /// Registers the flags. A single-process example (local = true, see local_session) has no
  /// checkpoints and no parameter servers to recover: --model_dir holds event files only, and
  /// the checkpoint and recovery flags are not offered.
  /// recovery = false (collective examples): no --max_recoveries.
  void add_to(dtf::flag_parser& f, bool local = false, bool recovery = true) {
    if (local) {
      f.add("model_dir", model_dir, "TensorBoard event files (empty: none)");
    } else {
      f.add("model_dir", model_dir, "checkpoints and TensorBoard event files; resumes from its latest checkpoint")
          .add("save_checkpoints_steps", save_checkpoints_steps, "chief: checkpoint every N global steps (0: off)")
          .add("save_checkpoints_secs", save_checkpoints_secs, "chief: checkpoint every S seconds (0: off)")
          .add("keep_checkpoints", keep_checkpoints, "checkpoints to keep (0: all)");
    }
    f.add("last_step", last_step, "stop at this global step (0: the example's own end)")
        .add("num_steps", num_steps, "stop after this many more global steps (0: the example's own end)")
        .add("summary_every", summary_every, "chief: TensorBoard summaries every N global steps (0: none)")
        .add("nan_policy", nan_policy, "a NaN or infinite loss: fail (exit with an error) or stop (save, end cleanly)");
    if (!local && recovery)
      f.add("max_recoveries", max_recoveries,
            "recover from a lost parameter server up to N times (with dtfrun --max-restarts; 0: fail)");
  }

  /// Checks the values; errors name the flag.
  void validate() const {
    auto bad = [](const std::string& flag, const std::string& why) {
      throw dtf::error(dtf::errc::invalid_config, "--" + flag + ": " + why);
    };
    if (nan_policy != "fail" && nan_policy != "stop") bad("nan_policy", "'" + nan_policy + "' is neither fail nor stop");
    if (last_step < 0) bad("last_step", "must not be negative");
    if (num_steps < 0) bad("num_steps", "must not be negative");
    if (last_step > 0 && num_steps > 0) bad("num_steps", "give --last_step or --num_steps, not both");
    if (save_checkpoints_steps < 0) bad("save_checkpoints_steps", "must not be negative");
    if (save_checkpoints_secs < 0) bad("save_checkpoints_secs", "must not be negative");
    if (keep_checkpoints < 0) bad("keep_checkpoints", "must not be negative");
    if (summary_every < 0) bad("summary_every", "must not be negative");
    if (max_recoveries < 0) bad("max_recoveries", "must not be negative");
  }
};

/// What the example adds to the standard session.
struct session_setup {
  /// The example's own last global step (sync: from the epochs); --last_step/--num_steps win.
  std::optional<std::int64_t> last_step;
  /// Chief without a checkpoint: initialise the ps (e.g. worker.initialize_ps(seed)).
  std::function<void()> init;
  dtf::optim::rule ps_rule = dtf::optim::sgd{};
  bool lock_free = false;
  std::size_t replicas_to_aggregate = 0;
  /// Chief after a restore: the restored values (e.g. to copy into the worker's parameters).
  std::function<void(std::span<const float>)> restored;
  /// After recovering from a lost ps (e.g. the strategy's begin(), which pulls θ̃ afresh).
  std::function<void()> after_recovery;
};

namespace detail {
inline std::atomic<dtf::monitored_training_session*> signal_session{nullptr};
inline std::atomic<int> signals_seen{0};

extern "C" inline void on_stop_signal(int sig) {
  // Async-signal-safe only: atomics, write(2), signal(), raise().
  if (signals_seen.fetch_add(1) > 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (auto* s = signal_session.load()) s->request_stop();
  static const char msg[] = "stop requested by signal: finishing the current step\n";
  [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
}
}  // namespace detail

/// Routes SIGTERM and SIGINT to session.request_stop() while alive (one at a time per
/// process); restores the previous handlers when destroyed.
class stop_on_signals {
 public:
  /// direct = false: the handler only counts the signal (stopped_by_signal()) and leaves the
  /// stop to the caller — collective_session agrees on it with every rank first.
  explicit stop_on_signals(dtf::monitored_training_session& s, bool direct = true) {
    detail::signals_seen = 0;
    detail::signal_session = direct ? &s : nullptr;
    old_term_ = std::signal(SIGTERM, detail::on_stop_signal);
    old_int_ = std::signal(SIGINT, detail::on_stop_signal);
  }
  ~stop_on_signals() {
    std::signal(SIGTERM, old_term_);
    std::signal(SIGINT, old_int_);
    detail::signal_session = nullptr;
  }
  stop_on_signals(const stop_on_signals&) = delete;
  stop_on_signals& operator=(const stop_on_signals&) = delete;

 private:
  void (*old_term_)(int) = SIG_DFL;
  void (*old_int_)(int) = SIG_DFL;
};

namespace detail {

/// The hooks every session gets, in this order: stop at --last_step (or the example's own
/// last step) / after --num_steps, the NaN check, progress lines. Returns the stop hook (the
/// logging hook shows its last step), or nullptr.
inline const dtf::hooks::stop_at_step* add_common_hooks(dtf::monitored_training_session& s, const hook_flags& f,
                                                        std::optional<std::int64_t> last, const std::string& me,
                                                        int log_every) {
  const dtf::hooks::stop_at_step* stop = nullptr;
  if (f.last_step > 0) last = f.last_step;
  if (last) stop = &s.add_hook(dtf::hooks::stop_at_step({.last_step = *last}));
  if (f.num_steps > 0) stop = &s.add_hook(dtf::hooks::stop_at_step({.num_steps = f.num_steps}));
  s.add_hook(dtf::hooks::nan_tensor(
      {.policy = f.nan_policy == "stop" ? dtf::hooks::nan_policy::stop : dtf::hooks::nan_policy::fail,
       .warn = [me](const std::string& w) { std::fprintf(stderr, "%s: %s\n", me.c_str(), w.c_str()); }}));
  s.add_hook(dtf::hooks::logging({.every_n_iter = log_every, .prefix = me, .stop = stop}));
  return stop;
}

/// The chief's summaries with --model_dir: global steps/s always, scalars and histograms
/// every --summary_every steps. Returns the event file's writer (nullptr without summaries).
inline std::shared_ptr<dtf::summary_writer> add_summary_hooks(dtf::monitored_training_session& s, const hook_flags& f,
                                                              bool is_chief) {
  if (f.model_dir.empty() || !is_chief) return nullptr;
  auto writer = std::make_shared<dtf::summary_writer>(f.model_dir);
  s.add_chief_hook(
      dtf::hooks::step_counter({.every_n_steps = f.summary_every > 0 ? f.summary_every : 100, .writer = writer}));
  if (f.summary_every > 0) s.add_chief_hook(dtf::hooks::summary_saver({.every_n_steps = f.summary_every, .writer = writer}));
  return writer;
}

}  // namespace detail

/// A monitored_training_session for a single-process example: the standard hooks without a
/// parameter server (no checkpoints, no recovery): stop, NaN check, progress lines, summaries
/// with --model_dir, and SIGTERM/SIGINT as a stop request. The step function's run_values
/// leave global_step empty: the session counts one global step per run.
class local_session {
 public:
  /// last_step: the example's own last step (--last_step/--num_steps win).
  local_session(const hook_flags& f, const std::string& me, int log_every,
                std::optional<std::int64_t> last_step = std::nullopt)
      : session_({.is_chief = true}), signals_(session_) {
    f.validate();
    detail::add_common_hooks(session_, f, last_step, me, log_every);
    writer_ = detail::add_summary_hooks(session_, f, true);
  }

  dtf::monitored_training_session& session() noexcept { return session_; }
  dtf::monitored_training_session* operator->() noexcept { return &session_; }
  /// Whether SIGTERM or SIGINT asked this process to stop.
  static bool stopped_by_signal() noexcept { return detail::signals_seen.load() > 0; }
  const std::shared_ptr<dtf::summary_writer>& writer() const noexcept { return writer_; }

 private:
  dtf::monitored_training_session session_;
  stop_on_signals signals_;
  std::shared_ptr<dtf::summary_writer> writer_;
};

/// A monitored_training_session for a ps example with the standard hooks (see the file
/// comment). The session restores or initialises the ps when created.
class standard_session {
 public:
  /// Runs f() — a step, a save, the end of the job — recovering from a lost ps when
  /// --max_recoveries allows (see dtf/recovery.hpp); otherwise just f().
  template <class F>
  decltype(auto) recoverable(F&& f) {
    if (recovery_) return recovery_->run(std::forward<F>(f));
    return std::forward<F>(f)();
  }
  standard_session(job& j, dtf::ps_client& ps, const hook_flags& f, session_setup setup)
      : session_({.is_chief = j.is_chief(),
                  .scaffold = dtf::ps_scaffold(ps, {.checkpoint_dir = f.model_dir,
                                                    .variables = j.net.variables(),
                                                    .rule = setup.ps_rule,
                                                    .lock_free = setup.lock_free,
                                                    .replicas_to_aggregate = setup.replicas_to_aggregate,
                                                    .init = setup.init,
                                                    .ready_timeout = std::chrono::milliseconds(j.timeout_ms),
                                                    .restored = setup.restored})}),
        signals_(session_) {
    f.validate();
    if (f.max_recoveries > 0) {
      // The chief re-initialises a ps that came back empty: every ps from the latest checkpoint,
      // or from scratch when there is none.
      auto reinitialise = [&ps, &j, f, setup] {
        if (f.model_dir.empty() || !ps.restore_latest(f.model_dir, j.net.variables(), setup.ps_rule, setup.lock_free,
                                                       setup.replicas_to_aggregate)) {
          std::fprintf(stderr, "%s: no checkpoint to restore the parameter servers from; initialising afresh\n",
                       j.me().c_str());
          if (setup.init) setup.init();
        }
      };
      recovery_.emplace(ps, j.is_chief(), reinitialise,
                        dtf::recovery_options{.max_recoveries = f.max_recoveries,
                                              .ready_timeout = std::chrono::milliseconds(j.timeout_ms)},
                        setup.after_recovery);
    }
    stop_ = detail::add_common_hooks(session_, f, setup.last_step, j.me(), j.log_every);
    if (f.model_dir.empty()) return;
    const dtf::checkpoint_options ck{.directory = f.model_dir, .max_to_keep = std::size_t(f.keep_checkpoints)};
    session_.add_chief_hook(dtf::hooks::checkpoint_saver(
        [this, &ps, ck, vars = j.net.variables()](std::int64_t step) -> dtf::checkpoint_manifest {
          return recoverable([&] { return ps.save_checkpoint(ck, vars, step); });
        },
        {.every_n_steps = f.save_checkpoints_steps, .every_secs = f.save_checkpoints_secs}));
    writer_ = detail::add_summary_hooks(session_, f, j.is_chief());
  }

  dtf::monitored_training_session& session() noexcept { return session_; }
  int recoveries() const noexcept { return recovery_ ? recovery_->recoveries() : 0; }
  /// Whether SIGTERM or SIGINT asked this task to stop.
  static bool stopped_by_signal() noexcept { return detail::signals_seen.load() > 0; }
  dtf::monitored_training_session* operator->() noexcept { return &session_; }
  /// The event file's writer (chief with --model_dir only).
  const std::shared_ptr<dtf::summary_writer>& writer() const noexcept { return writer_; }

  /// Copies every variable of the flat `params` into values.histograms when the session asked
  /// for summaries.
  static void add_variables(const dtf::run_context& ctx, const std::vector<dtf::variable_spec>& vars,
                            std::span<const float> params, dtf::run_values& values) {
    if (!ctx.summaries_requested()) return;
    for (const auto& v : vars)
      values.histograms[v.name].assign(params.begin() + std::ptrdiff_t(v.offset),
                                       params.begin() + std::ptrdiff_t(v.offset + v.size()));
  }

 private:
  dtf::monitored_training_session session_;
  stop_on_signals signals_;
  std::optional<dtf::ps_recovery> recovery_;
  const dtf::hooks::stop_at_step* stop_ = nullptr;
  std::shared_ptr<dtf::summary_writer> writer_;
};

/// A monitored_training_session for a collective example (ring_allreduce, mirrored: no ps,
/// every rank holds the whole model, gradients allreduced through a dtf::communicator) with
/// the standard hooks: --last_step/--num_steps, --nan_policy, progress lines on every rank,
/// and with --model_dir summaries and checkpoints by rank 0 (the chief).
///
/// Checkpoints: rank 0 saves the replicated variables and the update rule's slots and update
/// count with dtf::write_checkpoint (the ps format, one shard file; dtf-ckpt reads it) at the
/// start, every --save_checkpoints_steps/--save_checkpoints_secs and at the end. On start,
/// rank 0 reads the latest checkpoint in --model_dir (verified) and broadcasts it, so every rank
/// resumes from the same state; the example's own last step (and --last_step) is a global step,
/// so a resumed run ends where the first would have; --num_steps N trains N more steps from
/// wherever the run starts (the example's own end does not apply then). A resumed rank reads its
/// data shard from the start again.
///
/// Stops: every rank stops at the same step. The step limits and the NaN check see the same
/// (allreduced) loss on every rank; a signal reaches one task (dtfrun signals the chief), so
/// after each step the ranks allreduce (max) whether any of them was asked to stop.
///
/// Strategy: dtf::strategies::ring_allreduce or mirrored (parameters(), optimizer(),
/// global_step(), learning_rate(), restore()). Errors: those of the communicator and of
/// dtf/checkpoint.hpp (a corrupt checkpoint on rank 0 fails every rank, naming the cause).
template <class Strategy>
class collective_session {
 public:
  /// last_step: the example's own last step (--last_step/--num_steps win).
  collective_session(Strategy& strategy, dtf::communicator& comm, std::vector<dtf::variable_spec> variables,
                     const hook_flags& f, const std::string& me, int log_every,
                     std::optional<std::int64_t> last_step = std::nullopt)
      : strategy_(strategy), comm_(comm), variables_(std::move(variables)), flags_(f), me_(me),
        session_({.is_chief = comm.rank() == 0,
                  .scaffold = {.restore = [this]() { return share_checkpoint(); },
                               .wait_ready = [this] { share_checkpoint(); },
                               .global_step = [this] { return strategy_.global_step(); }}}),
        signals_(session_, false) {
    f.validate();
    if (f.max_recoveries > 0)
      throw dtf::error(dtf::errc::invalid_config, "--max_recoveries: a collective example has no parameter server");
    // --num_steps N: N more steps from wherever this run starts (a resumed run included).
    detail::add_common_hooks(session_, f, f.num_steps > 0 ? std::nullopt : last_step, me, log_every);
    if (!f.model_dir.empty()) {
      const dtf::checkpoint_options ck{.directory = f.model_dir, .max_to_keep = std::size_t(f.keep_checkpoints)};
      session_.add_chief_hook(dtf::hooks::checkpoint_saver(
          [this, ck](std::int64_t step) { return save(ck, step); },
          {.every_n_steps = f.save_checkpoints_steps, .every_secs = f.save_checkpoints_secs}));
      writer_ = detail::add_summary_hooks(session_, f, comm.rank() == 0);
    }
    session_.add_hook(agree_on_stop{&comm_});  // last: sees every other hook's stop request
  }

  /// One step: runs step() (which trains one step and returns the loss averaged over the
  /// ranks) inside the session; `examples` trained by this rank. Adds the learning rate and,
  /// when summaries are due, every variable as a histogram.
  template <class Step>
  void run(std::size_t examples, Step&& step) {
    session_.run([&](dtf::run_context& ctx) {
      dtf::run_values v;
      const double lr = double(strategy_.learning_rate());
      v.loss = double(step());
      v.global_step = strategy_.global_step();
      v.examples = examples;
      v.scalars["learning_rate"] = lr;
      if (ctx.summaries_requested()) standard_session::add_variables(ctx, variables_, host_parameters(), v);
      return v;
    });
  }

  dtf::monitored_training_session& session() noexcept { return session_; }
  dtf::monitored_training_session* operator->() noexcept { return &session_; }
  /// Whether SIGTERM or SIGINT asked this task to stop.
  static bool stopped_by_signal() noexcept { return detail::signals_seen.load() > 0; }
  const std::shared_ptr<dtf::summary_writer>& writer() const noexcept { return writer_; }
  /// The checkpoint this run resumed from ("" when none).
  const std::string& restored_from() const noexcept { return restored_; }

 private:
  /// Makes every rank stop after the same step: an allreduce (max) of "stop requested here".
  struct agree_on_stop {
    dtf::communicator* comm;
    void after_run(dtf::run_context& ctx, const dtf::run_values&) {
      if (comm->size() <= 1) {
        if (detail::signals_seen.load() > 0) ctx.request_stop();
        return;
      }
      float stop[1] = {(ctx.stop_requested() || detail::signals_seen.load() > 0) ? 1.0f : 0.0f};
      comm->allreduce("session/stop", std::span<float>(stop), dtf::reduce_op::max);
      if (stop[0] > 0) ctx.request_stop();
    }
  };

  std::vector<float> host_parameters() const {
    const auto p = strategy_.parameters();
    std::vector<float> host(p.size());
    thrust::copy(thrust::device_pointer_cast(p.data()), thrust::device_pointer_cast(p.data() + p.size()), host.begin());
    return host;
  }

  dtf::checkpoint_manifest save(const dtf::checkpoint_options& ck, std::int64_t step) {
    const auto values = host_parameters();
    const auto& opt = strategy_.optimizer();
    const auto slots = opt.host_slots();
    dtf::host_checkpoint_state state{.variables = variables_, .values = values, .rule = opt.rule_name(),
                                     .slots = {}, .iterations = opt.iterations(), .global_step = step};
    for (const auto& s : slots) state.slots.emplace_back(s);
    return dtf::write_checkpoint(ck, state);
  }

  /// Every rank: rank 0 reads the latest checkpoint under --model_dir (when there is one) and
  /// broadcasts it; every rank restores it. Returns the restored global step (rank 0's view).
  std::optional<std::int64_t> share_checkpoint() {
    if (flags_.model_dir.empty()) return std::nullopt;
    // header: found (1), none (0) or failed (-1); global step; update count; slots
    std::int64_t header[4] = {0, 0, 0, 0};
    std::optional<dtf::checkpoint_tensors> t;
    std::string name;
    if (comm_.rank() == 0) {
      try {
        if (auto latest = dtf::latest_checkpoint(flags_.model_dir)) {
          name = *latest;
          t = dtf::read_checkpoint(flags_.model_dir, name);
          header[0] = 1;
          header[1] = t->manifest.global_step;
          header[2] = t->manifest.variables.empty() ? 0 : t->manifest.variables.front().iterations;
          header[3] = std::int64_t(t->slots.size());
        }
      } catch (...) {
        header[0] = -1;
        comm_.broadcast("session/restore_header", std::span<std::int64_t>(header), 0);
        throw;
      }
    }
    comm_.broadcast("session/restore_header", std::span<std::int64_t>(header), 0);
    if (header[0] < 0)
      throw dtf::error(dtf::errc::io_error, "rank 0 could not read the latest checkpoint in " + flags_.model_dir);
    if (header[0] == 0) return std::nullopt;
    const std::size_t n = dtf::num_parameters(variables_);
    std::vector<float> values(n);
    std::vector<std::vector<float>> slots(static_cast<std::size_t>(header[3]), std::vector<float>(n));
    if (comm_.rank() == 0) {
      dtf::copy_into_layout(*t, variables_, values);
      for (std::size_t k = 0; k < slots.size(); ++k) dtf::copy_into_layout(*t, variables_, slots[k], int(k));
    }
    comm_.broadcast("session/restore_values", std::span<float>(values), 0);
    for (auto& s : slots) comm_.broadcast("session/restore_slot", std::span<float>(s), 0);
    strategy_.restore(values, slots, header[2], header[1]);
    restored_ = name.empty() ? "ckpt-" + std::to_string(header[1]) : name;
    std::printf("%s: restored %s from %s (global step %lld)\n", me_.c_str(), restored_.c_str(),
                flags_.model_dir.c_str(), static_cast<long long>(header[1]));
    std::fflush(stdout);
    return header[1];
  }

  Strategy& strategy_;
  dtf::communicator& comm_;
  std::vector<dtf::variable_spec> variables_;
  hook_flags flags_;
  std::string me_, restored_;
  dtf::monitored_training_session session_;
  stop_on_signals signals_;
  std::shared_ptr<dtf::summary_writer> writer_;
};

}  // namespace examples
