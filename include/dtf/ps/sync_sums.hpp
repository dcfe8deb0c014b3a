// dtf/ps/sync_sums.hpp — the sums of a synchronous step on one ps (the protocol:
// dtf/ps/sync_protocol.hpp; the aggregator: dtf/ps/sync_aggregator.hpp): per dense shard the sum
// of the step's contributions, and per embedding table the sum of every row any contribution
// sent. The average (the sums / N) is applied once with the step.
//
// Thread safety: none (the aggregator's mutex guards it).
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/ps/shard_store.hpp>
#include <dtf/ps/sync_part.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace dtf::ps_detail {

struct sync_sums {
  std::map<std::uint32_t, std::vector<float>> dense;  // per shard held here: the step's sum
  std::size_t floats = 0;                             // in dense: a part's
  struct row_sums {                                   // per table: this step's rows, summed
    std::uint32_t dim = 0;
    std::unordered_map<std::uint64_t, std::size_t> at;  // id -> its place in ids
    std::vector<std::uint64_t> ids;
    std::vector<float> values;
  };
  std::map<std::uint32_t, row_sums> rows;

  /// Zero sums over the store's shards (none for asynchronous training: a model-sized buffer).
  void reset(const shard_store& store, bool synchronous) {
    dense.clear();
    floats = 0;
    rows.clear();
    if (synchronous)
      for (const auto& [id, s] : store.shards()) {
        dense[id].assign(s->values.size(), 0.0f);
        floats += s->values.size();
      }
  }
  /// Adds a contribution: the floats of shards `ids` in order, and its rows.
  void add(const std::vector<std::uint32_t>& ids, std::span<const float> in, std::span<const contributed_rows> rs) {
    std::size_t at = 0;
    for (auto id : ids) {
      auto& acc = dense.at(id);
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += in[at + i];
      at += acc.size();
    }
    for (const auto& r : rs) {
      auto& sum = rows[r.table];
      sum.dim = r.dim;
      for (std::size_t i = 0; i < r.ids.size(); ++i) {
        auto [it, fresh] = sum.at.try_emplace(r.ids[i], sum.ids.size());
        if (fresh) {
          sum.ids.push_back(r.ids[i]);
          sum.values.resize(sum.values.size() + r.dim, 0.0f);
        }
        float* to = sum.values.data() + it->second * r.dim;
        for (std::size_t k = 0; k < r.dim; ++k) to[k] += r.rows[i * r.dim + k];
      }
    }
  }
  /// Adds a staged part.
  void add(const staged_part& p) {
    std::vector<contributed_rows> rs;
    for (const auto& r : p.rows) rs.push_back({r.table, r.dim, r.ids, r.values});
    add(p.ids, p.dense, rs);
  }
  /// Back to zero (the buffers kept).
  void clear() {
    for (auto& [id, acc] : dense) std::fill(acc.begin(), acc.end(), 0.0f);
    for (auto& [table, sum] : rows) sum.at.clear(), sum.ids.clear(), sum.values.clear();
  }
  /// Applies the dense average (the sums / n) with apply(shard id, update) at `kind` and `lr`,
  /// zeroing each sum as it goes. An exception of apply leaves the shards after it unapplied.
  template <class Apply>
  void apply_dense(std::size_t n, detail::update_kind kind, std::optional<float> lr, Apply& apply) {
    const float inv = 1.0f / float(n);
    for (auto& [id, acc] : dense) {
      for (auto& v : acc) v *= inv;
      apply(id, update{kind, acc, lr, 1.0f});
      std::fill(acc.begin(), acc.end(), 0.0f);
    }
  }
  /// Applies the rows' average with tables.apply_rows and empties the sums.
  template <class Tables>
  void apply_rows(std::size_t n, detail::update_kind kind, Tables& tables) {
    const float inv = 1.0f / float(n);
    for (auto& [table, sum] : rows) {
      if (sum.ids.empty()) continue;
      for (auto& v : sum.values) v *= inv;
      // Does not throw: the ids were checked when recorded (see sparse_service::apply_rows).
      tables.apply_rows(table, sum.ids, sum.values, kind == detail::update_kind::delta);
      sum.at.clear();  // emptied, not freed: the next step reuses the buffers
      sum.ids.clear();
      sum.values.clear();
    }
  }
};

}  // namespace dtf::ps_detail
