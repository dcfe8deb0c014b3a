// dtf/data/position.hpp — where a training task is in its input, so that a restarted task
// resumes there instead of reading its shard from the start (tf.data's iterator checkpoints,
// for dtf's in-memory pipeline).
//
// A dataset's batches are a pure function of (shard, seed, batch size, epoch, batch index):
// each epoch permutes the shard with seed + epoch (dataset::shuffle), so the pair (epoch, next
// batch) is the whole iterator state; dataset::stream(position) starts there. The position also
// carries what it is a position *in* (number of shards, shard size, batch size, shuffle seed):
// a position recorded by another configuration is stale, and unusable_in() says why.
//
// Where positions live in a job (dtf::train with a ps strategy): every training task reports
// its position to ps 0 after each step (dtf/ps/positions.hpp); the chief saves them with every
// checkpoint and restores them into a ps that lost them; a restarted task reads its own back.
// A collective strategy records none: its replicas train one batch each per global step, so
// their positions follow from the restored step (position::after).
// Thread safety: plain values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace dtf::data {

/// A training task's place in its data: the next batch to train on, the work done so far, and
/// the layout of the data it is a position in.
struct position {
  std::uint64_t epoch = 0;     ///< 0-based epoch of the next batch
  std::uint64_t batch = 0;     ///< 0-based index of the next batch within that epoch
  std::uint64_t examples = 0;  ///< examples trained on so far (every epoch, every restart)
  std::uint64_t steps = 0;     ///< batches trained on so far
  // What it is a position in.
  std::uint64_t num_shards = 0;  ///< training tasks the data is sharded over
  std::uint64_t shard_size = 0;  ///< examples in this task's shard
  std::uint64_t batch_size = 0;  ///< examples per batch
  std::uint64_t seed = 0;        ///< the shard's shuffle seed

  /// Equal when every field is.
  bool operator==(const position&) const = default;

  /// A fresh position (the start) in a shard of this layout.
  static position start_of(std::uint64_t num_shards, std::uint64_t shard_size, std::uint64_t batch_size,
                           std::uint64_t seed) {
    position p;
    p.num_shards = num_shards;
    p.shard_size = shard_size;
    p.batch_size = batch_size;
    p.seed = seed;
    return p;
  }

  /// Records that batch `index` of epoch `epoch` (`rows` examples) was trained on: the next
  /// one follows it (the first of the next epoch after the last of an epoch).
  void trained(std::uint64_t epoch_of_batch, std::uint64_t index, std::uint64_t rows,
               std::uint64_t batches_per_epoch) noexcept {
    epoch = epoch_of_batch;
    batch = index + 1;
    if (batch >= batches_per_epoch) {
      ++epoch;
      batch = 0;
    }
    examples += rows;
    ++steps;
  }

  /// The position `n` batches further on, as if trained() had recorded each of them: how a
  /// collective replica, which trains exactly one batch per global step from the start of its
  /// shard, finds its place after a restore from the global step alone
  /// (`start_of(...).after(step, batches_per_epoch)`). Examples are counted exactly, a short
  /// last batch of an epoch with its own rows: a whole epoch is min(shard, batches × batch
  /// size) examples (the shard, or its full batches when the remainder is dropped) and every
  /// batch before the last one of an epoch is full.
  position after(std::uint64_t n, std::uint64_t batches_per_epoch) const noexcept {
    if (n == 0 || batches_per_epoch == 0) return *this;
    const std::uint64_t per_epoch = std::min(shard_size, batches_per_epoch * batch_size);
    // Examples in the batches before batch `index` of the whole stream (every epoch in turn).
    auto before = [&](std::uint64_t index) {
      return index / batches_per_epoch * per_epoch + std::min(per_epoch, index % batches_per_epoch * batch_size);
    };
    const std::uint64_t from = epoch * batches_per_epoch + batch, to = from + n;
    position p = *this;
    p.epoch = to / batches_per_epoch;
    p.batch = to % batches_per_epoch;
    p.examples += before(to) - before(from);
    p.steps += n;
    return p;
  }

  /// Why this (recorded) position cannot be resumed in a shard laid out like `here` with
  /// `batches_per_epoch` batches per epoch; nullopt when it can.
  std::optional<std::string> unusable_in(const position& here, std::uint64_t batches_per_epoch) const {
    auto differs = [](const char* what, std::uint64_t was, std::uint64_t now) {
      return std::string(what) + " was " + std::to_string(was) + ", is " + std::to_string(now);
    };
    if (num_shards != here.num_shards) return differs("the number of shards", num_shards, here.num_shards);
    if (shard_size != here.shard_size) return differs("the shard's size", shard_size, here.shard_size);
    if (batch_size != here.batch_size) return differs("the batch size", batch_size, here.batch_size);
    if (seed != here.seed) return differs("the shuffle seed", seed, here.seed);
    if (batch >= batches_per_epoch && batches_per_epoch > 0)
      return "batch " + std::to_string(batch) + " is past the " + std::to_string(batches_per_epoch) +
             " batches of an epoch";
    if (steps > 0 && examples == 0) return "it counts " + std::to_string(steps) + " steps but no example";
    return std::nullopt;
  }

  /// cereal serialization (control messages, checkpoints).
  template <class A>
  void serialize(A& ar) {
    ar(epoch, batch, examples, steps, num_shards, shard_size, batch_size, seed);
  }
};

/// A task's position, named by the task ("worker.1").
struct task_position {
  /// The task, e.g. "worker.1".
  std::string task;
  /// Its position.
  position at;
  /// Equal when both fields are.
  bool operator==(const task_position&) const = default;
  /// cereal serialization (control messages, checkpoints).
  template <class A>
  void serialize(A& ar) {
    ar(task, at);
  }
};

}  // namespace dtf::data
