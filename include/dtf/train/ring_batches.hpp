// dtf/train/ring_batches.hpp — a collective rank's batches per step (dtf/train/collective.hpp's
// run phase): from the host streams (host_batches: one data::batch_stream per replica, built on a
// background thread each, copied to the engine's tensors by its step) or gathered on the device
// from a shard uploaded once (device_batches, train_options::device_data: the host streams'
// batches bit for bit, issued on the engine's stream when it has one). Each offers next() (the
// step's batches; returns their examples), step(engine) and, where the engine can leave its loss
// on the device, step_deferred(engine).
// replica_data: the job's replicas and their data (collective.hpp's shard_replicas builds it).
// Thread safety: one thread (the rank's training loop).
#pragma once

#include <dtf/data/dataset.hpp>
#include <dtf/data/device_shard.hpp>
#include <dtf/data/position.hpp>
#include <dtf/tensor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

namespace dtf::detail {

/// The job's replicas and their data: `r` replicas per process over the ranks (global), each
/// replica's own shard as a data position (its layout, the start), and this rank's streams.
struct replica_data {
  std::size_t r = 0, global = 0;
  std::size_t per_epoch = SIZE_MAX;  ///< the smallest shard's batches per epoch: every rank's steps per epoch
  std::vector<data::position> starts;
  std::vector<std::uint64_t> batches_per_epoch;
  std::int64_t epochs_last_step = 0;  ///< the step that ends --epochs
  std::vector<data::dataset> shards;  ///< this rank's replicas': shuffled, batched, endless, prefetched
};

/// A replica's batch stream (they neither copy nor move: built in place).
struct replica_stream {
  replica_stream(const data::dataset& d, const data::position& from) : s(d.stream(from)) {}
  data::batch_stream s;
};

/// The replicas' batches from their host streams (built on a background thread each), copied to
/// the engine's tensors by its step.
struct host_batches {
  host_batches(const replica_data& d, const std::vector<data::position>& at) : batches(d.r) {
    for (std::size_t k = 0; k < d.r; ++k) streams.emplace_back(d.shards[k], at[k]);
  }
  /// The next step's batches; returns their examples.
  std::size_t next() {
    std::size_t examples = 0;
    for (std::size_t k = 0; k < batches.size(); ++k) {
      batches[k] = *streams[k].s.next();
      examples += batches[k].labels.size();
    }
    return examples;
  }
  template <class Engine>
  float step(Engine& engine) {
    return engine.step(std::span<const data::host_batch>(batches));
  }
  template <class Engine>
    requires requires(Engine& e, std::span<const data::host_batch> b) { e.step_deferred(b); }
  void step_deferred(Engine& engine) {
    engine.step_deferred(std::span<const data::host_batch>(batches));
  }
  std::deque<replica_stream> streams;
  std::vector<data::host_batch> batches;
};

/// One replica's batches gathered on the device from its shard, uploaded once
/// (train_options::device_data): the host streams' batches, bit for bit, with no copy per step.
struct device_batches {
  /// `classes` > 0: every label is checked once, at upload (data::device_shard).
  device_batches(const replica_data& d, const data::position& from, std::size_t classes = 0)
      : shard(d.shards.front(), classes), at(from), per_epoch(shard.batches_per_epoch()) {}
  /// Gathers the next step's batch; returns its examples.
  std::size_t next() {
    shard.gather(std::size_t(at.epoch), std::size_t(at.batch), x, y);
    if (++at.batch == per_epoch) {
      at.batch = 0;
      ++at.epoch;
    }
    return y.size();
  }
  template <class Engine>
  float step(Engine& engine) {
    return engine.step(std::as_const(x), std::as_const(y));
  }
  template <class Engine>
    requires requires(Engine& e, const tensor& t) { e.step_deferred(t, t); }
  void step_deferred(Engine& engine) {
    engine.step_deferred(std::as_const(x), std::as_const(y));
  }
  data::device_shard shard;
  data::position at;
  std::uint64_t per_epoch;
  tensor x, y;
};

/// Whether an engine takes a batch already in device memory (ring_allreduce; not mirrored,
/// whose replicas each take a batch).
template <class Engine>
concept takes_device_batches = requires(Engine& e, const tensor& t) {
  { e.step(t, t) } -> std::convertible_to<float>;
};

}  // namespace dtf::detail
