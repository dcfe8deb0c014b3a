// dtf/ps/shard_snapshot.hpp — a ps's shards saved as its file of a checkpoint, streamed: each
// shard's values and optimiser slots are copied just before its bytes are written
// (detail::ckpt::stream_shard_file, dtf/checkpoint/writer.hpp), into one buffer reused from
// shard to shard. Memory: a save holds at most one shard's values and slots (the largest
// shard's, whatever the model's size; plus the writer's 1 MiB read-back buffer and the header's
// text), where copying every shard first made a ps of 3 GiB of values and 3 GiB of momentum hold
// 6 GiB more while it saved.
// Each shard is copied under its own lock, its update count read in the same hold, so no locked
// update is half-applied in the file and the header's iterations are those of the values saved.
// A lock-free (Hogwild) shard's values are copied with relaxed atomic loads, as its pulls are:
// its pushes update them with atomic fetch_adds and take no lock, so a plain read would be a
// data race (pushes may land part-way through the copy, as in a pull). A shard's lock is held
// for its copy only, so training goes on while the file is written, and a shard copied later
// holds the updates applied meanwhile; synchronous training keeps its step from moving for the
// whole write instead (the server's step lock: dtf/ps/server.hpp).
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/shard_store.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <mutex>
#include <vector>

namespace dtf::ps_detail {

/// Writes ps m.ps_index's file of checkpoint m.name in `dir` (the ps's own checkpoint directory;
/// the writer confines the name to it) from the shards of `store`, each copied in its turn (see
/// the file comment), and fills out's ids, iterations, file, sha256, bytes and num_slots. The
/// caller keeps the map of shards steady for the whole write (the server's shared lock), and
/// has set out.global_step. `fault` is for crash-safety tests only.
inline void save_shards(const shard_store& store, const std::filesystem::path& dir, const detail::ps_save_msg& m,
                        const checkpoint_fault& fault, detail::ps_saved_msg& out) {
  // A ps holding no shard knows no rule (the reader accepts any slot count of an empty file).
  const std::size_t num_slots = store.shards().empty() ? 0 : optim::detail::slot_count(store.rule());
  std::vector<detail::ckpt::shard_record> records;
  for (const auto& [id, s] : store.shards()) records.push_back({id, s->values.size(), 0, {}});
  std::unique_ptr<float[]> copy;  // one shard's values, then its slots: the save's only copy
  std::size_t held = 0;           // the floats it holds
  auto take = [&](detail::ckpt::shard_record& r) {
    shard& s = store.find(r.id);
    const std::size_t n = r.size;
    if (n * (1 + num_slots) > held) {
      copy.reset();  // freed before the larger one is allocated
      held = n * (1 + num_slots);
      copy = std::make_unique_for_overwrite<float[]>(held);
    }
    {
      std::lock_guard g(s.mu);
      r.iterations = shard_store::iterations(s);
      if (store.mode() == apply_mode::lock_free)
        store.copy_out({r.id}, reinterpret_cast<std::byte*>(copy.get()));
      else
        std::ranges::copy(s.values.view(), copy.get());
      for (std::size_t k = 0; k < num_slots; ++k) std::ranges::copy(s.opt->slot(k), copy.get() + (k + 1) * n);
    }
    r.tensors.clear();
    for (std::size_t k = 0; k <= num_slots; ++k) r.tensors.push_back(copy.get() + k * n);
    out.ids.push_back(r.id);
    out.iterations.push_back(r.iterations);
    if (fault.shard_copied) fault.shard_copied(held * sizeof(float));
  };
  const auto f = detail::ckpt::stream_shard_file(dir, m.name, std::size_t(m.ps_index), std::size_t(m.num_ps),
                                                 out.global_step, num_slots, std::move(records), take, fault,
                                                 m.at_step.has_value());  // a synchronous save: of one step
  out.file = f.name;
  out.sha256 = f.sha256;
  out.bytes = f.bytes;
  out.num_slots = num_slots;
}

}  // namespace dtf::ps_detail
