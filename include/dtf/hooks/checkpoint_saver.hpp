// dtf/hooks/checkpoint_saver.hpp — saves checkpoints every N steps or S seconds, at the start
// and at the end of a session (TensorFlow's CheckpointSaverHook), with listeners; and the
// session scaffold that restores a ps cluster from the latest checkpoint.
//
//   dtf::checkpoint_options ck{.directory = "run/ckpt", .max_to_keep = 3};
//   sess.add_chief_hook(dtf::hooks::checkpoint_saver::for_ps(ps, net.variables(), ck, {.every_n_steps = 500}));
//
// When it saves:
//   after_create_session  once, at the session's start step (save_at_start; a restored run
//                         writes its start step again under the same name, replacing it)
//   after_run             when every_n_steps global steps or every_secs seconds passed since
//                         the last save (the step_timer rule)
//   end                   at the final global step, when the session ended without error and
//                         that step was not saved yet. After an error nothing is saved: the
//                         state may be the cause (a NaN, a dead ps), and the latest checkpoint
//                         is what a restart resumes from.
// Listeners (TensorFlow's CheckpointSaverListener): begin, before_save(step),
// after_save(step, manifest) — returning true requests a stop — and end(step).
// Usually a chief-only hook: the chief writes the manifest and state file.
//
// Thread safety: a hook's own state; the session calls it from one thread.
// Errors: a failed save throws (dtf::error from the checkpoint code): the session ends with it.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/hooks/timer.hpp>
#include <dtf/ps.hpp>
#include <dtf/session.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dtf::hooks {

/// Called around every save; every member optional.
struct checkpoint_listener {
  /// Before the session is created.
  std::function<void()> begin;
  /// Before each save, with its global step.
  std::function<void(std::int64_t step)> before_save;
  /// Returns true to stop the session after this step.
  std::function<bool(std::int64_t step, const checkpoint_manifest& saved)> after_save;
  /// At the session's end, with its last global step.
  std::function<void(std::int64_t step)> end;
};

/// When a checkpoint_saver saves.
struct checkpoint_saver_options {
  std::int64_t every_n_steps = 0;  ///< 0: not by steps
  double every_secs = 600;         ///< 0: not by time (TensorFlow's default is 600 s)
  /// Save at the session's start step.
  bool save_at_start = true;
  /// Save the final global step when the session ends without error.
  bool save_at_end = true;
  /// Called around every save.
  std::vector<checkpoint_listener> listeners;
};

/// Hook: saves checkpoints every N global steps or S seconds, at the session's start and at its
/// end after no error (TensorFlow's CheckpointSaverHook), and tells its listeners.
class checkpoint_saver {
 public:
  /// Saves the checkpoint for a global step; returns its manifest.
  using save_fn = std::function<checkpoint_manifest(std::int64_t step)>;

  /// Saves through `save` when `o` says. Errors: errc::invalid_argument without a save function.
  checkpoint_saver(save_fn save, checkpoint_saver_options o)
      : save_(std::move(save)), options_(std::move(o)), timer_(options_.every_n_steps, options_.every_secs) {
    if (!save_) throw error(errc::invalid_argument, "checkpoint_saver: no save function");
  }

  /// Saves through a ps cluster: every ps writes its shard, this task the manifest
  /// (ps_client::save_checkpoint).
  static checkpoint_saver for_ps(ps_client& ps, std::vector<variable_spec> vars, checkpoint_options ck,
                                 checkpoint_saver_options o = {}) {
    return checkpoint_saver(
        [&ps, vars = std::move(vars), ck = std::move(ck)](std::int64_t step) {
          return save_checkpoint(ps, ck, vars, step);
        },
        std::move(o));
  }

  /// dtf::session_hook: before the session is created.
  void begin() {
    for (auto& l : options_.listeners)
      if (l.begin) l.begin();
  }

  /// dtf::session_hook: after restore or initialisation, at the start step.
  void after_create_session(run_context& ctx) {
    if (options_.save_at_start) save(ctx, ctx.global_step());
    else timer_.update(ctx.global_step());
  }

  /// dtf::session_hook: after each step, with the step's values.
  void after_run(run_context& ctx, const run_values&) {
    if (timer_.should_trigger(ctx.global_step())) save(ctx, ctx.global_step());
  }

  /// dtf::session_hook: once, at close or on error (`status` carries the error).
  void end(run_context& ctx, const run_status& status) {
    if (status.ok() && options_.save_at_end && last_saved_ != ctx.global_step()) save(ctx, ctx.global_step());
    for (auto& l : options_.listeners)
      if (l.end) l.end(ctx.global_step());
  }

  /// Checkpoints this hook saved.
  std::int64_t saves() const noexcept { return saves_; }
  /// Global step of the last one (nullopt before the first).
  std::optional<std::int64_t> last_saved_step() const noexcept { return last_saved_; }
  /// Manifest of the last one.
  const std::optional<checkpoint_manifest>& last_manifest() const noexcept { return last_manifest_; }

 private:
  void save(run_context& ctx, std::int64_t step) {
    timer_.update(step);
    for (auto& l : options_.listeners)
      if (l.before_save) l.before_save(step);
    last_manifest_ = save_(step);
    last_saved_ = step;
    ++saves_;
    bool stop = false;
    for (auto& l : options_.listeners)
      if (l.after_save && l.after_save(step, *last_manifest_)) stop = true;
    if (stop) ctx.request_stop();
  }

  save_fn save_;
  checkpoint_saver_options options_;
  step_timer timer_;
  std::int64_t saves_ = 0;
  std::optional<std::int64_t> last_saved_;
  std::optional<checkpoint_manifest> last_manifest_;
};
static_assert(session_hook<checkpoint_saver>);

}  // namespace dtf::hooks

namespace dtf {

/// What a ps-backed session needs to create its state.
struct ps_scaffold_options {
  std::string checkpoint_dir;  ///< empty: never restore
  /// The variables the checkpoints hold.
  std::vector<variable_spec> variables;
  ps_config config{};  ///< as in ps_client::initialize
  std::function<void()> init;  ///< chief, no checkpoint: initialise the ps (e.g. worker.initialize_ps(seed))
  std::chrono::milliseconds ready_timeout{60000};  ///< other tasks: bound on waiting for the chief
  /// Chief, after a restore: receives the restored values (the caller's copy of the model).
  std::function<void(std::span<const float>)> restored;
  /// When the latest checkpoint fails verification: restore the newest kept one that verifies
  /// (saying so in the log), or refuse (the session's creation fails).
  checkpoint_fallback fallback = checkpoint_fallback::newest_valid;
  /// The run's embedding tables (each created by the chief before the session is): restored
  /// with the dense variables (restore_tables, dtf/ps/table_checkpoint.hpp); nullptr: none.
  embedding_tables* tables = nullptr;
  /// Chief: sees the manifest of the checkpoint about to be restored, before anything is sent
  /// to a ps; a throw refuses the restore (the session's creation fails with it).
  std::function<void(const checkpoint_manifest&)> check;
};

/// The session scaffold of a ps cluster: the chief restores every ps from the latest
/// checkpoint of checkpoint_dir that verifies (resharding to the client's placement; see
/// ps_client::restore_latest and ps_scaffold_options::fallback) or, when there is none,
/// calls init; other tasks wait (bounded) until every ps is ready; the global step is read
/// from ps 0.
inline session_scaffold ps_scaffold(ps_client& ps, ps_scaffold_options o) {
  auto shared = std::make_shared<ps_scaffold_options>(std::move(o));
  session_scaffold s;
  s.restore = [&ps, shared]() -> std::optional<std::int64_t> {
    if (shared->checkpoint_dir.empty()) return std::nullopt;
    std::vector<float> values(num_parameters(shared->variables));
    auto step = restore_latest(ps, shared->checkpoint_dir, shared->variables, shared->config, values, shared->fallback,
                               restore_transfer::through_chief, shared->tables, shared->check);
    if (step && shared->restored) shared->restored(values);
    return step;
  };
  s.init = [shared] {
    if (shared->init) shared->init();
  };
  s.wait_ready = [&ps, shared] { ps.wait_ready(shared->ready_timeout); };
  s.global_step = [&ps] { return ps.global_step(); };
  return s;
}

}  // namespace dtf
