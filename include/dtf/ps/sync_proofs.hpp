// dtf/ps/sync_proofs.hpp — the proofs of the synchronous protocol over several ps
// (docs/design/sync-protocol.md): MACs under the ps key Kps = HMAC-SHA256(M, "dtf ps key v1")
// (dtf/transport/credentials.hpp), which only the ps derive, from the master secret they hold.
//   a receipt  (ps p, step, contribution id, rate): ps p > 0 holds every segment of that part;
//              the worker carries one of every ps p > 0 in its commit, and ps 0 admits no
//              commit without them, so no decision names a part some ps does not hold
//   a decision (step, rate, the ids in order): ps 0 decided it; ps p > 0 applies no other
// A worker forwards both and can make neither: every field is under the MAC. Without a secret
// there is no key: nothing is signed and nothing is required (every peer can present any
// identity then, so nothing could bind a worker anyway).
//
// Thread safety: const members are reentrant.
#pragma once

#include <dtf/detail/hmac.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/error.hpp>
#include <dtf/transport/credentials.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dtf::ps_detail {

using detail::contribution_id;
using detail::step_rate;
using detail::sync_decision;
using detail::sync_receipt;

inline std::string describe(const contribution_id& id) {
  return id.worker + " (incarnation " + std::to_string(id.incarnation) + ", contribution " +
         std::to_string(id.sequence) + ")";
}

/// "gradients at learning rate 0.1", "deltas", "gradients at the rule's rate".
inline std::string describe(const step_rate& r) {
  if (r.kind == detail::update_kind::delta) return "deltas";
  if (!r.learning_rate) return "gradients at the rule's rate";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(*r.learning_rate));
  return std::string("gradients at learning rate ") + buf;
}

/// This ps's proofs: its key (none without a secret), its index and the job's ps count.
/// Copyable (the interleaving test copies states).
class sync_proofs {
 public:
  sync_proofs() = default;  ///< no key: nothing is proven, nothing required
  /// `key`: Kps (derive_ps_key), empty for none; this ps is `ps_index` of `num_ps`.
  sync_proofs(std::string key, std::uint32_t ps_index, std::uint32_t num_ps)
      : key_(std::move(key)), index_(ps_index), count_(num_ps) {}
  /// A ps's proofs: Kps of its master secret (none when empty), its place from the chief's
  /// init or restore.
  static sync_proofs of(const std::string& master_secret, const detail::ps_init_msg& m) {
    return {master_secret.empty() ? std::string() : derive_ps_key(master_secret), m.ps_index, m.num_ps};
  }

  bool on() const noexcept { return !key_.empty(); }  ///< a key: proofs are made and required
  std::uint32_t index() const noexcept { return index_; }
  std::uint32_t count() const noexcept { return count_; }

  /// ps 0: signs decision d (no proof without a key).
  void sign(sync_decision& d) const { d.mac = on() ? mac_of(d) : detail::digest{}; }
  /// Whether ps 0 made decision d, as it reads (always true without a key).
  bool genuine(const sync_decision& d) const { return !on() || detail::digests_equal(d.mac, mac_of(d)); }

  /// This ps's receipt for id's part of `step`, of `rate`, which it holds whole.
  sync_receipt receipt(std::int64_t step, const contribution_id& id, const step_rate& rate) const {
    sync_receipt r{index_, step, id, rate, {}};
    if (on()) r.mac = mac_of(r);
    return r;
  }

  /// ps 0: checks that `receipts` hold, for every ps p in 1 .. count - 1, p's receipt for id's
  /// part of `step` at `rate`. Errors (errc::invalid_argument, naming the commit and the ps):
  /// a receipt missing (that ps has not staged the whole part), or one that is not that ps's
  /// for this part (another step, id or rate, or a MAC it did not make). Nothing without a key.
  void check_receipts(const std::vector<sync_receipt>& receipts, std::int64_t step, const contribution_id& id,
                      const step_rate& rate) const {
    if (!on()) return;
    for (std::uint32_t p = 1; p < count_; ++p) {
      const auto it = std::find_if(receipts.begin(), receipts.end(), [&](const sync_receipt& r) { return r.ps == p; });
      const auto ps = "ps." + std::to_string(p);
      if (it == receipts.end())
        throw error(errc::invalid_argument, describe(id) + " committed to step " + std::to_string(step) +
                                                " without " + ps + "'s receipt: " + ps +
                                                " has not staged its part (stage every part before the commit)");
      sync_receipt expected{p, step, id, rate, {}};
      if (!detail::digests_equal(it->mac, mac_of(expected)))
        throw error(errc::invalid_argument, describe(id) + " committed to step " + std::to_string(step) + " (" +
                                                describe(rate) + ") with a receipt that is not " + ps +
                                                "'s for that part: refused");
    }
  }

  bool operator==(const sync_proofs&) const = default;

 private:
  static std::string text_of(const step_rate& r) {
    return detail::framed(std::to_string(int(r.kind))) +
           detail::framed(r.learning_rate ? std::to_string(std::bit_cast<std::uint32_t>(*r.learning_rate)) : "none");
  }
  static std::string text_of(const contribution_id& id) {
    return detail::framed(id.worker) + detail::framed(std::to_string(id.incarnation)) +
           detail::framed(std::to_string(id.sequence));
  }
  detail::digest mac_of(const sync_decision& d) const {
    std::string text = detail::framed(std::to_string(d.step)) + text_of(d.rate) + detail::framed(std::to_string(d.ids.size()));
    for (const auto& id : d.ids) text += text_of(id);
    return detail::hmac_sha256(key_, {"dtf sync decision v1", text});
  }
  detail::digest mac_of(const sync_receipt& r) const {
    return detail::hmac_sha256(key_, {"dtf sync receipt v1", detail::framed(std::to_string(r.ps)),
                                      detail::framed(std::to_string(r.step)), text_of(r.id), text_of(r.rate)});
  }

  std::string key_;
  std::uint32_t index_ = 0, count_ = 1;
};

}  // namespace dtf::ps_detail
