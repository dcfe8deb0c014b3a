// dtf/ps/sync_part.hpp — a synchronous contribution's part as one ps receives it (the protocol:
// dtf/ps/sync_protocol.hpp; the sums: dtf/ps/sync_aggregator.hpp): its embedding rows, the
// staged copy of a part and how a part's segments join, and the checks of a part or segment
// against the shards the ps holds.
//
// A part larger than one request arrives in segments (docs/design/large-models.md): consecutive
// requests, each carrying some of the ps's shards, the rows of embedding tables with the last.
// The segments of one part name every shard of the ps exactly once between them.
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/error.hpp>
#include <dtf/ps/shard_store.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace dtf::ps_detail {

/// Rows of one embedding table in a synchronous contribution (sparse_service::sync_rows reads
/// them from the payload): ids.size() * dim floats.
struct contributed_rows {
  std::uint32_t table = 0, dim = 0;
  std::span<const std::uint64_t> ids;
  std::span<const float> rows;
};

/// A staged part (or the segments of one staged so far): a copy, the request's buffer being the
/// connection's.
struct staged_part {
  struct rows_copy {
    std::uint32_t table = 0, dim = 0;
    std::vector<std::uint64_t> ids;
    std::vector<float> values;
  };
  std::vector<std::uint32_t> ids;  // the dense floats' shards, in the sender's order
  std::vector<float> dense;
  std::vector<rows_copy> rows;
  detail::update_kind kind = detail::update_kind::gradient;
  std::optional<float> lr;

  staged_part() = default;
  staged_part(const detail::ps_sync_push_msg& m, std::span<const float> in, std::span<const contributed_rows> rs)
      : ids(m.ids), dense(in.begin(), in.end()), kind(m.kind), lr(m.learning_rate) {
    for (const auto& r : rs) rows.push_back({r.table, r.dim, {r.ids.begin(), r.ids.end()}, {r.rows.begin(), r.rows.end()}});
  }
  /// Appends the next segment of the same part (its kind and rate were checked against ours).
  static void join(staged_part& held, staged_part&& next) {
    held.ids.insert(held.ids.end(), next.ids.begin(), next.ids.end());
    held.dense.insert(held.dense.end(), next.dense.begin(), next.dense.end());
    for (auto& r : next.rows) held.rows.push_back(std::move(r));
  }
  bool finite() const noexcept {
    bool ok = all_finite(dense);
    for (const auto& r : rows) ok = ok && all_finite(r.values);
    return ok;
  }
};

/// Checks a part or segment `m` of `who`'s contribution to step `step` against this ps, whose
/// shards are the keys of `held`: its kind, its segment's place, shards of this ps not named
/// by the part's `earlier` segments (and, with the last segment, every shard of the ps once
/// over the part: the average is over whole contributions), its values' finiteness under
/// `policy`. Returns its dense floats, or nullopt to skip it (nonfinite_policy::skip).
inline std::optional<std::span<const float>> check_part(const std::string& who, std::int64_t step,
                                                        const detail::ps_sync_push_msg& m,
                                                        std::span<const std::byte> payload,
                                                        std::span<const contributed_rows> rows, const shard_store& store,
                                                        const std::map<std::uint32_t, std::vector<float>>& held,
                                                        nonfinite_policy policy, const staged_part* earlier = nullptr) {
  if (m.kind == detail::update_kind::scaled_delta || m.kind == detail::update_kind::scaled_gradient)
    throw error(errc::invalid_argument, who + ": a synchronous contribution cannot be staleness-scaled");
  if (m.learning_rate && !std::isfinite(*m.learning_rate))
    throw error(errc::invalid_argument, who + ": a synchronous contribution's learning rate is not finite");
  // Every segment but a last one of rows alone names a shard: at most one more than the shards.
  if (m.segments == 0 || m.segment >= m.segments || m.segments > held.size() + 1)
    throw error(errc::invalid_argument, who + ": segment " + std::to_string(m.segment) + " of " +
                                            std::to_string(m.segments) + " of a part over " +
                                            std::to_string(held.size()) + " shards");
  const bool last = m.segment + 1 == m.segments;
  if (!rows.empty() && !last)
    throw error(errc::invalid_argument, who + ": rows of embedding tables come with a part's last segment");
  if (earlier && (earlier->kind != m.kind || earlier->lr != m.learning_rate))
    throw error(errc::invalid_argument, who + ": a segment of another kind or learning rate than its part's first");
  std::set<std::uint32_t> before;
  if (earlier) before.insert(earlier->ids.begin(), earlier->ids.end());
  const std::size_t named = before.size() + m.ids.size();
  const bool foreign = std::any_of(m.ids.begin(), m.ids.end(), [&](auto id) { return !held.count(id) || before.count(id); });
  if (foreign || (last && named != held.size()) || store.bytes_of(m.ids) != payload.size())
    throw error(errc::shape_mismatch, who + ": a synchronous contribution must carry every shard of this ps once (" +
                                          std::to_string(m.ids.size()) + " shards, " + std::to_string(payload.size()) +
                                          " bytes sent in segment " + std::to_string(m.segment) + " of " +
                                          std::to_string(m.segments) + ", " + std::to_string(before.size()) +
                                          " shards before it)");
  const std::span<const float> in(reinterpret_cast<const float*>(payload.data()), payload.size() / sizeof(float));
  bool finite = m.all_finite || policy == nonfinite_policy::apply;
  if (policy != nonfinite_policy::apply) {
    finite = finite && all_finite(in) && (!earlier || earlier->finite());
    for (const auto& r : rows) finite = finite && all_finite(r.rows);
  }
  if (finite) return in;
  if (policy == nonfinite_policy::reject)
    throw error(errc::invalid_argument, who + " contributed non-finite values to step " + std::to_string(step));
  return std::nullopt;
}

}  // namespace dtf::ps_detail
