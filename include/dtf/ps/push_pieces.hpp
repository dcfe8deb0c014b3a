// dtf/ps/push_pieces.hpp — a push applied a piece at a time as its bytes arrive.
//
// A push of at least transport_options::pieces_min_bytes whose sender checked its values
// finite (ps_push_msg::all_finite; the ps client checks every such push from host memory) is
// cut into pieces of whole shards, each at least ps_options::apply_piece_bytes but the last.
// The transport hands a piece over once its bytes are in, while the next one's arrive
// (rpc_pieces), and its shards are applied then through shard_store::apply, as a push applied
// whole would apply them. What stays as it is for a push applied whole:
//   - a locked shard is never seen half-updated: a shard is never split across pieces, and its
//     lock is taken only once all its bytes are in (no lock is held while bytes arrive);
//   - the staleness and DynSGD's scale are the push's (taken when its meta arrives); the update
//     counts once, after its last shard, and the global step advances then;
//   - every value is checked before it is applied (nonfinite_policy reject or skip).
// What differs, only for a sender that declares finite values and sends a NaN or infinity: the
// piece holding it and the pieces after it are not applied, the pieces before it were; the
// reply is an error naming the worker, the shard and the shards applied. An honest sender's
// non-finite push (all_finite false) is not taken in pieces: it is refused (or skipped) whole.
// An init or restore that replaces the model while a push arrives ends it the same way.
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/shard_store.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::ps_detail {

class push_pieces {
 public:
  /// Plans the pieces of push m, whose payload is bytes_of(m.ids) bytes (the caller checked),
  /// under the server's shared lock; `model_generation` counts the model's replacements.
  push_pieces(detail::ps_push_msg m, const shard_store& store, std::uint64_t model_generation,
              std::uint64_t staleness, std::size_t min_piece_bytes)
      : m_(std::move(m)), generation_(model_generation), staleness_(staleness) {
    std::uint64_t at = 0, piece_begin = 0;
    for (std::size_t i = 0; i < m_.ids.size(); ++i) {
      at += store.find(m_.ids[i]).values.size() * sizeof(float);
      if (at - piece_begin >= min_piece_bytes || i + 1 == m_.ids.size()) {
        ends_.push_back(at);
        shard_end_.push_back(i + 1);  // piece k holds shards [shard_end_[k-1], shard_end_[k])
        piece_begin = at;
      }
    }
  }

  /// Where each piece ends, in payload bytes.
  const std::vector<std::uint64_t>& ends() const noexcept { return ends_; }
  const detail::ps_push_msg& message() const noexcept { return m_; }
  std::uint64_t staleness() const noexcept { return staleness_; }
  std::size_t shards_applied() const noexcept { return applied_; }
  /// Why a piece was not applied; empty while every piece so far was.
  const std::string& failure() const noexcept { return failure_; }

  /// Applies piece k (its bytes) to `store`, under the server's shared lock, or records why not.
  void apply(std::size_t k, std::span<const std::byte> bytes, shard_store& store, std::uint64_t model_generation,
             nonfinite_policy policy) {
    if (!failure_.empty()) return;
    if (model_generation != generation_) {
      failure(k, "the model was replaced (init or restore) while it arrived");
      return;
    }
    const std::span<const float> in(reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float));
    const std::size_t first = k == 0 ? 0 : shard_end_[k - 1];
    if (policy != nonfinite_policy::apply) {
      std::size_t at = 0;
      for (std::size_t i = first; i < shard_end_[k]; ++i) {
        const std::size_t n = store.find(m_.ids[i]).values.size();
        if (!all_finite(in.subspan(at, n))) {
          failure(k, "holds non-finite values in shard " + std::to_string(m_.ids[i]) +
                         ", although its sender declared them finite");
          return;
        }
        at += n;
      }
    }
    // A shard that throws (bad_alloc in copy on write) ends the push like a lie: the reply
    // names what was applied, and the update counts (finish) when any shard was.
    const std::vector<std::uint32_t> ids(m_.ids.begin() + std::ptrdiff_t(first), m_.ids.begin() + std::ptrdiff_t(shard_end_[k]));
    try {
      store.apply_all(ids, {m_.kind, {}, m_.learning_rate, 1.0f / float(staleness_ + 1)}, in, applied_);
    } catch (const std::exception& e) {
      failure(k, std::string("could not be applied (") + e.what() + ")");
    }
  }

 private:
  void failure(std::size_t k, const std::string& why) {
    failure_ = why + ": its first " + std::to_string(applied_) + " of " + std::to_string(m_.ids.size()) +
               " shards were applied as they arrived, the " + std::to_string(m_.ids.size() - applied_) +
               " from piece " + std::to_string(k) + " on were not";
  }

  detail::ps_push_msg m_;
  std::uint64_t generation_, staleness_;
  std::vector<std::uint64_t> ends_;
  std::vector<std::size_t> shard_end_;
  std::size_t applied_ = 0;
  std::string failure_;
};

}  // namespace dtf::ps_detail
