// dtf/train/hybrid_checkpoint.hpp — the checkpoints of a hybrid job (docs/design/hybrid.md
// section 3): the embedding tables written by the ps, the dense variables by rank 0, one
// manifest and one global step on every file.
//
// Save at ring step t (hybrid_checkpoints, a hook on every rank, when rank 0's cadence says so):
// every rank's pushes of step t were acknowledged when its step returned (a synchronous push
// returns once every ps applied the step), so after a barrier nothing of step t + 1 can reach a
// ps; rank 0 then saves (save_hybrid) while the others wait for its word, success or failure.
// save_hybrid is the ps path's save_checkpoint (every ps writes its shard file, empty: it holds
// no dense shard, and its table file; a synchronous job's steps held) completed, before its
// manifest is committed, with the dense part as the collective path writes it (save_replicated):
// every dense variable whole, in ps 0's shard file, which rank 0 writes in place of the empty one
// ps 0 wrote, at step t. The manifest names step t; ps 0's file holds step t, every other ps's its
// own (t in a synchronous job; an asynchronous ps never counts steps, so its file holds the step
// of its last restore, never past t): dtf-ckpt verify checks both (check_shard_step).
//
// Restore (restore_hybrid, rank 0, once the collective path's restore has checked the latest
// checkpoint and before it broadcasts the dense part to every rank): the ps path's
// restore_checkpoint with no dense variable, into the current ps layout: the tables (rows
// re-routed to any number of ps, dtf/ps/table_checkpoint.hpp) and every ps's step, so a
// synchronous ps continues at the ring's step. The data positions follow from the global step.
// Errors: those of the communicator, of the ps client and of the checkpoint code; a rank whose
// rank 0 failed to save fails with errc::io_error naming the step (the run ends, the previous
// checkpoint stays the latest); a synchronous ps whose step is not the ring's at a save is
// errc::invalid_argument naming both; a ps lost during rank 0's save (errc::peer_failure or
// errc::timeout) is strategies::lost_ps on every rank, as a ps lost in a step.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/collectives.hpp>
#include <dtf/hooks/collective_restore.hpp>
#include <dtf/hooks/timer.hpp>
#include <dtf/ps.hpp>
#include <dtf/session.hpp>
#include <dtf/strategies/hybrid.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::detail {

/// Rank 0's checkpoint of a hybrid job at ring step `step` (see the file comment): the ps write
/// the tables, rank 0 the dense variables `vars` of `engine`; returns the manifest committed.
template <class Engine>
checkpoint_manifest save_hybrid(ps_client& ps, const checkpoint_options& ck, const std::vector<variable_spec>& vars,
                                const Engine& engine, std::int64_t step) {
  return hooks::save_replicated(ck, vars, engine, step, [&](const host_checkpoint_state& dense) {
    return save_checkpoint(ps, ck, {}, step, [&](checkpoint_manifest& m) {
      if (m.synchronous && m.global_step != step)
        throw error(errc::invalid_argument, "hybrid checkpoint " + m.name + ": the parameter servers are at step " +
                                                std::to_string(m.global_step) + ", the ring at step " +
                                                std::to_string(step));
      m.global_step = step;
      const auto records = ckpt::whole_variables(dense, m);
      for (auto& f : m.files)  // ps 0 holds no dense shard: its empty file gives way to the dense one
        if (f.ps == 0) f = ckpt::write_shard_file(ck.directory, m.name, 0, m.num_ps, step, m.num_slots, records);
    });
  });
}

/// Rank 0's restore of what the ps hold from checkpoint `man` of `dir` (see the file comment):
/// the tables into the current layout, every ps's step set to the checkpoint's.
inline void restore_hybrid(ps_client& ps, const std::string& dir, const checkpoint_manifest& man,
                           embedding_tables& tables, const ps_config& config) {
  if (man.tables.empty())
    throw error(errc::invalid_argument, "checkpoint " + man.name + " of " + dir +
                                            " holds no embedding table: it is not a hybrid job's");
  (void)restore_checkpoint(ps, dir, man.name, {}, config, {}, restore_transfer::through_chief, &tables);
}

/// Hook, on every rank of a hybrid job: the checkpoints at rank 0's cadence (every_n_steps,
/// every_secs: its clock decides for every rank), at the session's start step and at its end
/// after no error, as hooks::checkpoint_saver saves, with the barrier of the file comment.
/// `save`: rank 0's save of a step (save_hybrid).
class hybrid_checkpoints {
 public:
  hybrid_checkpoints(communicator& comm, std::function<checkpoint_manifest(std::int64_t)> save,
                     std::int64_t every_n_steps, double every_secs)
      : comm_(&comm), save_(std::move(save)), timer_(every_n_steps, every_secs), by_time_(every_secs > 0) {}

  /// dtf::session_hook: at the start step.
  void after_create_session(run_context& ctx) { save(ctx.global_step()); }
  /// dtf::session_hook: after each step; rank 0's timer decides (sent to the others when it
  /// counts seconds; steps alone decide the same on every rank).
  void after_run(run_context& ctx, const run_values&) {
    const std::int64_t step = ctx.global_step();
    std::int64_t due[1] = {timer_.should_trigger(step) ? 1 : 0};
    if (by_time_ && comm_->size() > 1) comm_->broadcast("hybrid/save_due", std::span<std::int64_t>(due), 0);
    if (due[0] != 0) save(step);
  }
  /// dtf::session_hook: at the close, the final step unless saved (not after an error).
  void end(run_context& ctx, const run_status& status) {
    if (status.ok() && last_saved_ != ctx.global_step()) save(ctx.global_step());
  }
  /// Checkpoints saved (on every rank: those rank 0 saved).
  std::int64_t saves() const noexcept { return saves_; }

 private:
  void save(std::int64_t step) {
    timer_.update(step);
    comm_->barrier();  // every rank's pushes of `step` acknowledged; none of the next sent
    std::int64_t saved[1] = {1};  // 0: failed; 2: a ps was lost (every rank throws lost_ps)
    if (comm_->rank() == 0) {
      try {
        (void)save_(step);
      } catch (const error& e) {
        const bool lost = e.code() == make_error_code(errc::peer_failure) || e.code() == make_error_code(errc::timeout);
        saved[0] = lost ? 2 : 0;
        if (comm_->size() > 1) comm_->broadcast("hybrid/saved", std::span<std::int64_t>(saved), 0);
        if (lost)
          throw strategies::lost_ps(e.code(), "hybrid: the checkpoint of step " + std::to_string(step) +
                                                  ": rank 0 lost a parameter server: " + e.message());
        throw;
      } catch (...) {
        saved[0] = 0;
        if (comm_->size() > 1) comm_->broadcast("hybrid/saved", std::span<std::int64_t>(saved), 0);
        throw;
      }
    }
    if (comm_->size() > 1) comm_->broadcast("hybrid/saved", std::span<std::int64_t>(saved), 0);
    if (saved[0] == 2)
      throw strategies::lost_ps(errc::peer_failure, "hybrid: the checkpoint of step " + std::to_string(step) +
                                                        ": rank 0 lost a parameter server");
    if (saved[0] == 0)
      throw error(errc::io_error, "rank 0 failed to save the checkpoint of step " + std::to_string(step));
    last_saved_ = step;
    ++saves_;
  }

  communicator* comm_;
  std::function<checkpoint_manifest(std::int64_t)> save_;
  hooks::step_timer timer_;
  bool by_time_;
  std::optional<std::int64_t> last_saved_;
  std::int64_t saves_ = 0;
};
static_assert(session_hook<hybrid_checkpoints>);

}  // namespace dtf::detail
