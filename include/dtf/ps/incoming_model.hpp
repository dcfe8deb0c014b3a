// dtf/ps/incoming_model.hpp — an init or restore a ps receives in parts (ps_init_msg::part of
// parts; the client's cut: dtf/ps/request_parts.hpp; the contract: docs/design/large-models.md).
//
// Part 0 starts a model, dropping one not finished (a chief that died part-way and restarted
// starts again); part k > 0 must follow part k - 1 from the same sender, of the same kind, for
// the same configuration and (a restore) the same checkpoint and step. Each part's shards are
// built by the caller as its payload arrives (the payload buffer holds one part) and kept here
// until the last part, when the whole model is taken and installed. A part out of order is
// refused, naming the part expected; the shards kept so far stay until the next part 0.
// Bounds: at most max_parts parts, and a shard id at most once over all of them (a peer cannot
// make the ps build a shard twice).
//
// Thread safety: none; the server calls it under its exclusive lock.
#pragma once

#include <dtf/detail/archive.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/error.hpp>
#include <dtf/ps/shard_store.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dtf::ps_detail {

class incoming_model {
 public:
  static constexpr std::uint32_t max_parts = 1u << 20;

  /// Takes part m.part of m.parts of a `what` ("init", "restore") from `sender`; `tag` names
  /// what every part must agree on besides the configuration (a restore's checkpoint and step).
  /// `shards`: the part's (none when only the sizes matter: a second init). True when this was
  /// the last part: whole() and take_shards() then give the model.
  /// Errors: corrupt_data (part numbers, a shard named twice), invalid_argument (out of order).
  bool add(const std::string& what, const std::string& sender, const std::string& tag, const detail::ps_init_msg& m,
           std::map<std::uint32_t, std::unique_ptr<shard>> shards) {
    if (m.parts == 0 || m.parts > max_parts || m.part >= m.parts)
      throw error(errc::corrupt_data, what + " part " + std::to_string(m.part) + " of " + std::to_string(m.parts));
    if (m.part == 0) {
      *this = incoming_model{};
      what_ = what, sender_ = sender, tag_ = tag, parts_ = m.parts, config_ = config_bytes(m);
    } else if (m.part != next_ || what != what_ || sender != sender_ || tag != tag_ || m.parts != parts_ ||
               config_bytes(m) != config_) {
      const std::string expected =
          next_ == 0 ? "no " + what + " is under way"
                     : "expected part " + std::to_string(next_) + " of " + std::to_string(parts_) + " of the " + what_ +
                           " from " + sender_ + (tag_.empty() ? "" : " (" + tag_ + ")");
      throw error(errc::invalid_argument, what + " part " + std::to_string(m.part) + " of " + std::to_string(m.parts) +
                                              " from " + sender + (tag.empty() ? "" : " (" + tag + ")") +
                                              " refused: " + expected + "; a " + what + " in parts starts with part 0");
    }
    if (m.ids.size() != m.sizes.size()) throw error(errc::corrupt_data, what + ": ids and sizes differ in length");
    for (std::size_t i = 0; i < m.ids.size(); ++i)  // checked whole first: a refused part changes nothing
      if (seen_.contains(m.ids[i]) || std::find(m.ids.begin(), m.ids.begin() + i, m.ids[i]) != m.ids.begin() + i)
        throw error(errc::corrupt_data, what + ": shard " + std::to_string(m.ids[i]) + " appears twice");
    seen_.insert(m.ids.begin(), m.ids.end());
    whole_.ids.insert(whole_.ids.end(), m.ids.begin(), m.ids.end());
    whole_.sizes.insert(whole_.sizes.end(), m.sizes.begin(), m.sizes.end());
    shards_.merge(shards);
    if (++next_ < parts_) return false;
    auto ids = std::move(whole_.ids);
    auto sizes = std::move(whole_.sizes);
    whole_ = m;
    whole_.ids = std::move(ids), whole_.sizes = std::move(sizes), whole_.part = 0, whole_.parts = 1;
    return true;
  }

  /// Once the last part is in: the configuration with every part's ids and sizes.
  const detail::ps_init_msg& whole() const noexcept { return whole_; }
  /// Once the last part is in: the shards built, for the store; forgets the model (read
  /// whole() first).
  std::map<std::uint32_t, std::unique_ptr<shard>> take_shards() {
    auto out = std::move(shards_);
    *this = incoming_model{};
    return out;
  }

 private:
  // The configuration of part m, without what differs between parts.
  static std::vector<std::byte> config_bytes(detail::ps_init_msg m) {
    m.ids.clear(), m.sizes.clear(), m.part = 0;
    return detail::encode_message(m);
  }

  std::string what_, sender_, tag_;
  std::uint32_t parts_ = 0, next_ = 0;
  std::vector<std::byte> config_;
  std::set<std::uint32_t> seen_;
  detail::ps_init_msg whole_;  // the parts' ids and sizes so far; with the last, its configuration
  std::map<std::uint32_t, std::unique_ptr<shard>> shards_;
};

}  // namespace dtf::ps_detail
