// dtf/train/resume.hpp — where a resumed run stands against the end it trains to, checked before
// its first step, so that no task ends after 0 steps without a word (issue 31). A global step or
// a data position from a checkpoint that this configuration could not have produced is an error
// naming the checkpoint (or where the value came from) and the value; one at the end means the
// training is already finished, and each task says so in a line. TensorFlow does the same: a
// StopAtStepHook at a step already reached ends the session before its first step (Estimator
// logs "Skipping training since max_steps has already saved"), and a corrupt value is an error.
//
// The rules (S: the global step the run starts at; L: the last step it trains to):
//   synchronous ps training and collective strategies end exactly at L (--last_step, or the
//     steps of --epochs): S < L trains, S == L is finished, S > L is an error (the checkpoint of
//     a longer run, or a damaged one: more --epochs or a larger --last_step resumes it);
//   asynchronous training with --last_step: S >= L is finished (pushes in flight carry S past L);
//   --num_steps counts from S: S + num_steps must not overflow;
//   a data position (dtf/data/position.hpp) must be one that dtf::train produces in its layout:
//     its batch inside an epoch, `steps` == epoch × batches per epoch + batch (a position counts
//     every batch its stream passed, across restarts) and `examples` what those batches hold;
//     an asynchronous task trains --epochs of its shard: a position at the end of the last epoch
//     is finished, one past it an error. A synchronous worker's position has no epoch bound
//     (backup workers and dropped contributions make a worker pass more than its share of the
//     data): its end is the step.
// Errors: dtf::error(errc::invalid_config) for a value beyond the configuration's reach,
// errc::corrupt_data for a position no run produces (or whose arithmetic overflows).
#pragma once

#include <dtf/data/dataset.hpp>
#include <dtf/data/position.hpp>
#include <dtf/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace dtf::detail {

/// How a run ends: what check_start_step compares the global step it starts at with.
struct run_end {
  std::optional<std::int64_t> last_step;  ///< the step it trains to (nullopt: --num_steps counts from the start)
  bool exact = true;       ///< no step past last_step is reached (synchronous, collective)
  std::int64_t num_steps = 0;  ///< --num_steps, counted from the start step
  std::string what;        ///< how last_step was set, for the messages ("2 epochs of 13 steps")
};

/// Checks global step `step` (from `source`, e.g. "checkpoint ckpt-30 of DIR") against `end`.
/// Returns the line to print when the training is already finished (empty: train).
/// Errors: errc::invalid_config naming the source and both steps (see the file comment).
inline std::string check_start_step(std::int64_t step, const run_end& end, const std::string& source) {
  const std::string at = "global step " + std::to_string(step) + " (" + source + ")";
  if (step < 0) throw error(errc::corrupt_data, at + " is negative");
  if (end.num_steps > std::numeric_limits<std::int64_t>::max() - step)
    throw error(errc::invalid_config, at + " plus --num_steps " + std::to_string(end.num_steps) + " overflows");
  if (!end.last_step || step < *end.last_step) return {};
  const std::string last = "the last step of this run, " + std::to_string(*end.last_step) + " (" + end.what + ")";
  if (step > *end.last_step && end.exact)
    throw error(errc::invalid_config, at + " is beyond " + last + ": this configuration never reaches it; the "
                                           "checkpoint is a longer run's or damaged (train to a later step to resume "
                                           "it, or start in another model_dir)");
  return at + " is at or past " + last + ": training already finished, nothing to train";
}

/// Checks data position `p` of task `task` (from `source`) in a shard of `batches_per_epoch`
/// batches; `epochs`: those an asynchronous task trains (nullopt: synchronous, no bound).
/// Returns whether it is the end of the last epoch (the task's training is finished).
/// Errors: errc::corrupt_data / invalid_config naming the source, the task and the position.
inline bool check_position(const data::position& p, std::uint64_t batches_per_epoch,
                           std::optional<std::uint64_t> epochs, const std::string& task, const std::string& source) {
  const auto fail = [&](errc code, const std::string& why) {
    throw error(code, source + ": the data position of " + task + " (epoch " + std::to_string(p.epoch) + ", batch " +
                          std::to_string(p.batch) + ", " + std::to_string(p.steps) + " steps, " +
                          std::to_string(p.examples) + " examples) " + why);
  };
  const std::uint64_t per = batches_per_epoch;
  if (per == 0) {  // an empty shard: its stream has no batch to pass
    if (p.epoch || p.batch || p.steps || p.examples) fail(errc::corrupt_data, "is not the start of an empty shard");
    return false;
  }
  if (p.batch >= per) fail(errc::corrupt_data, "names a batch past the " + std::to_string(per) + " of an epoch");
  std::uint64_t index = 0, whole = 0, examples = 0;
  if (__builtin_mul_overflow(p.epoch, per, &index) || __builtin_add_overflow(index, p.batch, &index) ||
      __builtin_mul_overflow(p.epoch, p.shard_size, &whole) ||
      __builtin_add_overflow(whole, std::min(p.shard_size, p.batch * p.batch_size), &examples) ||
      index > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
    fail(errc::corrupt_data, "overflows its arithmetic");
  if (p.steps != index || p.examples != examples)
    fail(errc::corrupt_data, "is not one a run produces: at batch " + std::to_string(index) + " of its stream it has "
                                 "passed " + std::to_string(index) + " steps and " + std::to_string(examples) +
                                 " examples");
  std::uint64_t end = 0;  // the batch index after the last epoch (none that far: no bound)
  if (!epochs || __builtin_mul_overflow(*epochs, per, &end) || index < end) return false;
  if (index > end)
    fail(errc::invalid_config, "is past the end of the --epochs " + std::to_string(*epochs) + " this run trains: "
                               "this configuration never gets there (more --epochs resume it; another model_dir "
                               "starts over)");
  return true;
}

/// check_position for each of a checkpoint's positions (`source`) that is in one of this run's
/// shards: `data` sharded over `num_shards` training tasks, task k's shuffled with seed + k, in
/// batches of `batch`. A position in another layout is not resumed (its task starts its shard
/// over, saying why), so it is not checked.
inline void check_positions(const std::vector<data::task_position>& positions, const data::dataset& data,
                            std::size_t num_shards, std::size_t batch, std::uint64_t seed,
                            std::optional<std::uint64_t> epochs, const std::string& source) {
  for (const auto& [task, p] : positions) {
    if (p.num_shards != num_shards || p.batch_size != batch || p.seed < seed || p.seed - seed >= num_shards) continue;
    const auto shard = data.shard(num_shards, std::size_t(p.seed - seed));
    if (p.shard_size == shard.size())
      (void)check_position(p, shard.batch(batch).batches_per_epoch(), epochs, task, source);
  }
}

/// Rank 0's line on a resumed run: where the replicas' shards resume (runs of consecutive
/// replicas at the same place share one entry) and the examples trained before, over all.
inline std::string resumed_positions(const std::string& me, std::uint64_t step, const std::vector<data::position>& at) {
  std::uint64_t examples = 0;
  for (const auto& p : at) examples += p.examples;
  std::string line = me + ": resuming from global step " + std::to_string(step) + " (" + std::to_string(examples) +
                     " examples trained before, over " + std::to_string(at.size()) +
                     (at.size() == 1 ? " replica): " : " replicas): ");
  auto place = [](const data::position& p) {
    return "epoch " + std::to_string(p.epoch) + ", batch " + std::to_string(p.batch);
  };
  for (std::size_t first = 0; first < at.size();) {
    std::size_t last = first;
    auto same = [&](const data::position& p) { return p.epoch == at[first].epoch && p.batch == at[first].batch; };
    while (last + 1 < at.size() && same(at[last + 1])) ++last;
    if (first > 0) line += "; ";
    if (first == 0 && last + 1 == at.size())
      line += "each replica's shard at ";
    else if (first == last)
      line += "replica " + std::to_string(first) + " at ";
    else
      line += "replicas " + std::to_string(first) + "-" + std::to_string(last) + " at ";
    line += place(at[first]);
    first = last + 1;
  }
  return line;
}

}  // namespace dtf::detail
