// dtf/ps/shard_snapshot.hpp — a ps's shards saved as its file of a checkpoint: a copy of every
// shard's values and optimiser slots, each taken under its shard's lock (so no locked update is
// half-applied in it), then the file written from the copies outside every lock
// (dtf/checkpoint/writer.hpp), so training goes on while the file is written. A lock-free
// (Hogwild) shard's values are copied with relaxed atomic loads, as its pulls are: its pushes
// update them with atomic fetch_adds and take no lock, so a plain read would be a data race
// (pushes may land part-way through the copy, as in a pull).
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/shard_store.hpp>

#include <cstddef>
#include <filesystem>
#include <mutex>
#include <vector>

namespace dtf::ps_detail {

/// What a save copies of the shards.
struct shard_snapshot {
  std::vector<std::vector<float>> copies;  ///< per shard: its values, then its num_slots slots
  std::vector<detail::ckpt::shard_record> records;
  std::size_t num_slots = 0;
};

/// Copies every shard of `store`, each under its own lock (lock-free: with atomic loads); the
/// caller keeps the map of shards steady (the server's shared lock). Records the shards' ids and iterations in `out`.
inline shard_snapshot snapshot_shards(const shard_store& store, detail::ps_saved_msg& out) {
  shard_snapshot snap;
  for (const auto& [id, s] : store.shards()) {
    std::lock_guard g(s->mu);
    snap.num_slots = optim::detail::slot_count(s->opt->update_rule());
    const auto it = shard_store::iterations(*s);
    snap.records.push_back({id, s->values.size(), it, {}});
    if (store.mode() == apply_mode::lock_free) {
      snap.copies.emplace_back(s->values.size());
      store.copy_out({id}, reinterpret_cast<std::byte*>(snap.copies.back().data()));
    } else {
      const auto v = s->values.view();
      snap.copies.emplace_back(v.begin(), v.end());
    }
    for (std::size_t k = 0; k < snap.num_slots; ++k) {
      auto slot = s->opt->slot(k);
      snap.copies.emplace_back(slot.begin(), slot.end());
    }
    out.ids.push_back(id);
    out.iterations.push_back(it);
  }
  return snap;
}

/// Writes `snap` as ps m.ps_index's file of checkpoint m.name in `dir` (the ps's own checkpoint
/// directory; the writer confines the name to it) and fills out's file, sha256, bytes and
/// num_slots. `fault` is for crash-safety tests only.
inline void write_snapshot(shard_snapshot& snap, const std::filesystem::path& dir, const detail::ps_save_msg& m,
                           const checkpoint_fault& fault, detail::ps_saved_msg& out) {
  std::size_t c = 0;
  for (auto& r : snap.records)
    for (std::size_t k = 0; k <= snap.num_slots; ++k) r.tensors.push_back(snap.copies[c++].data());
  const auto f = detail::ckpt::write_shard_file(dir, m.name, std::size_t(m.ps_index), std::size_t(m.num_ps),
                                                out.global_step, snap.num_slots, snap.records, fault);
  out.file = f.name;
  out.sha256 = f.sha256;
  out.bytes = f.bytes;
  out.num_slots = snap.num_slots;
}

}  // namespace dtf::ps_detail
