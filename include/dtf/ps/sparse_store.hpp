// dtf/ps/sparse_store.hpp — the embedding-table shards one ps holds, and their row updates.
//
// gather(ids)         copies the rows of ids (fixed: held here and in range; hashed: created from
//                     the initialiser on first touch) into the reply
// push(ids, rows)     applies one update per row: a gradient through the table's rule, "lazily"
//                     as TensorFlow's sparse apply does (only the touched rows' values and slots
//                     move; the rule's update count — Adam's t — is the shard's, counting
//                     pushes), or a delta added
// Ids in one request are distinct (the client deduplicates): a repeated id is an error, as is an
// id outside the table or held by another ps, each naming the table and the id.
//
// snapshot(table)     its shards' rows as a checkpoint's table file records them
// reset, restore_rows a restore from a checkpoint: push counts set (hashed shards emptied), then
//                     rows replaced
//
// Bounds: a fixed table's shard is allocated at init, checked against
// ps_options::max_sparse_bytes (no payload backs it, so this is what a peer could ask for); a
// hashed shard holds at most capacity() rows (values and slots), and refuses new ids when full
// with nothing to evict.
//
// Thread safety: each shard has a mutex held for a whole gather or push of its rows; the map of
// tables is guarded by the caller (dtf/ps/sparse_service.hpp: creation exclusive, the rest shared).
#pragma once

#include <dtf/checkpoint/table_format.hpp>
#include <dtf/error.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/ps/embedding_layout.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dtf::ps_detail {

/// A delta row added as sent (host_apply's kernel shape).
struct delta_kernel {
  void operator()(float& p, float g, float*, float*, std::size_t) const { p += g; }
};

/// One shard of one table: rows of dim floats and, beside each row, the rule's slots.
struct sparse_shard {
  std::uint32_t index = 0;
  std::uint64_t capacity = 0;
  std::vector<float> values, slot0, slot1;  // row-major, capacity (fixed) or grown (hashed) rows
  std::int64_t iterations = 0;              // pushes applied (Adam's t)
  // hashed tables
  std::unordered_map<std::uint64_t, std::uint32_t> row_of;  // id -> row
  std::vector<std::uint64_t> id_of_row;
  std::vector<std::uint64_t> last_seen;  // the shard's clock (pushes) when the row was last touched
  std::vector<std::uint32_t> free_rows;
  std::uint64_t evicted = 0;
  std::mutex mu;
};

struct sparse_table {
  embedding_layout layout;
  optim::rule rule;
  std::size_t num_slots = 0;
  std::map<std::uint32_t, std::unique_ptr<sparse_shard>> shards;  // the ones held here
};

/// What gather/push do with one row each.
class sparse_store {
 public:
  /// Creates table `table` (a fixed table's rows initialised here) holding `held` of the
  /// layout's shards. Errors: invalid_argument (another table of this id, shards not of this
  /// ps, more bytes than max_bytes).
  void create(std::uint32_t table, embedding_layout layout, const optim::rule& rule, std::size_t this_ps,
              std::uint64_t max_bytes) {
    if (tables_.count(table)) {
      const auto& t = tables_.at(table);
      if (t.layout.spec.name == layout.spec.name && t.layout.spec.dim == layout.spec.dim &&
          t.layout.spec.rows == layout.spec.rows && t.layout.shards.size() == layout.shards.size())
        return;  // a restarted chief: the rows here win
      throw error(errc::invalid_argument, "embedding table " + std::to_string(table) + " already holds '" +
                                              t.layout.spec.name + "'");
    }
    sparse_table t{std::move(layout), rule, optim::detail::slot_count(rule), {}};
    const auto& l = t.layout;
    const std::uint64_t row_bytes = std::uint64_t(l.spec.dim) * sizeof(float) * (1 + t.num_slots);
    std::uint64_t bytes = bytes_;
    for (std::size_t j = 0; j < l.shards.size(); ++j) {
      if (l.shards[j].ps != this_ps) continue;
      const std::uint64_t cap = l.capacity(j);
      if (cap >= (std::uint64_t(1) << 32))
        throw error(errc::invalid_argument, "embedding '" + l.spec.name + "': a shard of " + std::to_string(cap) +
                                                " rows (at most 2^32 - 1 per shard)");
      if (cap > (max_bytes - std::min(bytes, max_bytes)) / row_bytes)
        throw error(errc::invalid_argument, "embedding '" + l.spec.name + "': shard " + std::to_string(j) +
                                                " would take this ps beyond its " + std::to_string(max_bytes) +
                                                " bytes for sparse tables (ps_options::max_sparse_bytes)");
      bytes += cap * row_bytes;
    }
    for (std::size_t j = 0; j < l.shards.size(); ++j) {
      if (l.shards[j].ps != this_ps) continue;
      auto s = std::make_unique<sparse_shard>();
      s->index = std::uint32_t(j);
      s->capacity = l.capacity(j);
      if (!l.spec.hashed()) {
        const std::uint64_t n = s->capacity;
        s->values.resize(n * l.spec.dim);
        for (std::uint64_t r = 0; r < n; ++r)
          l.spec.init(l.id_of(j, r), std::span<float>(s->values).subspan(r * l.spec.dim, l.spec.dim));
        const float init = optim::detail::slot_initial_value(rule);
        if (t.num_slots >= 1) s->slot0.assign(s->values.size(), init);
        if (t.num_slots >= 2) s->slot1.assign(s->values.size(), init);
      }
      t.shards[std::uint32_t(j)] = std::move(s);
    }
    bytes_ = bytes;
    tables_.emplace(table, std::move(t));
  }

  const sparse_table& table(std::uint32_t id) const {
    auto it = tables_.find(id);
    if (it == tables_.end()) throw error(errc::out_of_range, "embedding table " + std::to_string(id) + " is not held here");
    return it->second;
  }
  sparse_table& table(std::uint32_t id) { return const_cast<sparse_table&>(std::as_const(*this).table(id)); }
  const std::map<std::uint32_t, sparse_table>& tables() const noexcept { return tables_; }

  /// Copies the rows of `ids` (distinct) into out (ids.size() * dim floats).
  void gather(std::uint32_t table_id, std::span<const std::uint64_t> ids, std::span<float> out) {
    auto& t = table(table_id);
    const std::uint32_t dim = t.layout.spec.dim;
    if (out.size() != ids.size() * dim) throw error(errc::internal, "gather: output of the wrong size");
    for_each_shard(t, ids, [&](sparse_shard& s, std::span<const std::size_t> at) {
      for (auto i : at) {
        const std::uint64_t r = row(t, s, ids[i], true);
        std::memcpy(out.data() + i * dim, s.values.data() + r * dim, dim * sizeof(float));
      }
    });
  }

  /// Checks ids as a push would (each held here, each once, in range); changes nothing.
  void check_ids(std::uint32_t table_id, std::span<const std::uint64_t> ids) {
    for_each_shard(table(table_id), ids, [](sparse_shard&, std::span<const std::size_t>) {});
  }
  /// Checks ids as a push would and makes a hashed table's missing rows, as a gather does;
  /// moves no value.
  void touch(std::uint32_t table_id, std::span<const std::uint64_t> ids) {
    auto& t = table(table_id);
    for_each_shard(t, ids, [&](sparse_shard& s, std::span<const std::size_t> at) {
      for (auto i : at) row(t, s, ids[i], true);
    });
  }

  /// Applies rows[i] (dim floats) to row ids[i] for every i: a gradient through the table's
  /// rule (at lr when given), or a delta added.
  void push(std::uint32_t table_id, std::span<const std::uint64_t> ids, std::span<const float> rows, bool delta,
            std::optional<float> lr) {
    auto& t = table(table_id);
    const std::uint32_t dim = t.layout.spec.dim;
    if (rows.size() != ids.size() * dim) throw error(errc::internal, "push: rows of the wrong size");
    for_each_shard(t, ids, [&](sparse_shard& s, std::span<const std::size_t> at) {
      ++s.iterations;
      const float rate = lr ? *lr : optim::detail::base_learning_rate(t.rule);
      std::visit(
          [&](const auto& r) {
            using R = std::decay_t<decltype(r)>;
            if (delta) return apply_rows(t, s, ids, rows, at, delta_kernel{});
            if constexpr (std::is_same_v<R, optim::sgd>) {
              apply_rows(t, s, ids, rows, at, optim::detail::sgd_kernel{rate, r.weight_decay});
            } else if constexpr (std::is_same_v<R, optim::momentum>) {
              apply_rows(t, s, ids, rows, at, optim::detail::momentum_kernel{rate, r.momentum, r.nesterov, r.weight_decay});
            } else if constexpr (std::is_same_v<R, optim::adagrad>) {
              apply_rows(t, s, ids, rows, at, optim::detail::adagrad_kernel{rate, r.epsilon, r.weight_decay});
            } else {
              const double n = double(s.iterations);
              const float lr_t = float(rate * std::sqrt(1.0 - std::pow(double(r.beta2), n)) /
                                       (1.0 - std::pow(double(r.beta1), n)));
              apply_rows(t, s, ids, rows, at, optim::detail::adam_kernel{lr_t, r.beta1, r.beta2, r.epsilon,
                                                                        optim::detail::adam_l2(r),
                                                                        optim::detail::adam_keep(r, rate)});
            }
          },
          t.rule);
      if (t.layout.spec.hashed() && t.layout.spec.evict_after > 0 && s.iterations % std::int64_t(t.layout.spec.evict_after) == 0)
        evict(t, s);
    });
  }

  /// Rows held, per table (hashed: created and not evicted), and rows evicted so far.
  std::uint64_t rows_held(std::uint32_t table_id) const {
    std::uint64_t n = 0;
    for (auto& [j, s] : table(table_id).shards) {
      std::lock_guard g(s->mu);
      n += table(table_id).layout.spec.hashed() ? s->row_of.size() : s->capacity;
    }
    return n;
  }
  std::uint64_t rows_evicted(std::uint32_t table_id) const {
    std::uint64_t n = 0;
    for (auto& [j, s] : table(table_id).shards) {
      std::lock_guard g(s->mu);
      n += s->evicted;
    }
    return n;
  }

  /// The table as a checkpoint records it (spec, shards, rule), and its shards held here with
  /// their rows as records (dtf/checkpoint/table_file.hpp), ids rising; each shard copied under
  /// its lock.
  detail::ckpt::table_snapshot snapshot(std::uint32_t table_id) {
    auto& t = table(table_id);
    const std::string rule = std::visit([](const auto& r) { return std::string(std::decay_t<decltype(r)>::name); }, t.rule);
    detail::ckpt::table_snapshot out{{t.layout.spec, t.layout.shards.size(), rule, t.num_slots, 0}, {}};
    const std::size_t dim = t.layout.spec.dim, rb = std::size_t(out.table.record_bytes());
    for (auto& [j, sp] : t.shards) {
      auto& s = *sp;
      std::lock_guard g(s.mu);
      std::vector<std::pair<std::uint64_t, std::uint64_t>> rows;  // (id, row)
      if (t.layout.spec.hashed()) {
        rows.assign(s.row_of.begin(), s.row_of.end());
        std::sort(rows.begin(), rows.end());
      } else {
        for (std::uint64_t r = 0; r < s.capacity; ++r) rows.emplace_back(t.layout.id_of(j, r), r);  // ids rise with r
      }
      auto& out_shard = out.shards.emplace_back();
      out_shard.index = j;
      out_shard.iterations = s.iterations;
      out_shard.rows = rows.size();
      out_shard.records.resize(rows.size() * rb);
      std::byte* at = out_shard.records.data();
      const float* tensors[] = {s.values.data(), s.slot0.data(), s.slot1.data()};
      for (const auto& [id, r] : rows) {
        std::memcpy(at, &id, 8);
        at += 8;
        for (std::size_t k = 0; k <= t.num_slots; ++k, at += dim * sizeof(float))
          std::memcpy(at, tensors[k] + r * dim, dim * sizeof(float));
        if (t.layout.spec.hashed()) {
          const std::uint64_t age = std::uint64_t(s.iterations) - s.last_seen[r];
          std::memcpy(at, &age, 8);
          at += 8;
        }
      }
    }
    return out;
  }

  /// A restore's start: the shards of the table held here (`shards`, exactly those) take these
  /// push counts; a hashed shard is emptied. Errors: invalid_argument naming the table.
  void reset(std::uint32_t table_id, std::span<const std::uint32_t> shards, std::span<const std::int64_t> iterations) {
    auto& t = table(table_id);
    std::set<std::uint32_t> listed(shards.begin(), shards.end());
    bool negative = false;
    for (auto it : iterations) negative = negative || it < 0;
    if (shards.size() != iterations.size() || listed.size() != shards.size() || listed.size() != t.shards.size() ||
        negative || !std::equal(listed.begin(), listed.end(), t.shards.begin(), t.shards.end(),
                                [](std::uint32_t a, const auto& b) { return a == b.first; }))
      throw error(errc::invalid_argument, "restore of embedding '" + t.layout.spec.name +
                                              "': the shards or push counts named are not those held here");
    for (std::size_t i = 0; i < shards.size(); ++i) {
      auto& s = *t.shards.at(shards[i]);
      std::lock_guard g(s.mu);
      s.iterations = iterations[i];
      if (!t.layout.spec.hashed()) continue;
      s.row_of.clear();
      s.id_of_row.clear();
      s.last_seen.clear();
      s.free_rows.clear();
      s.values.clear();
      s.slot0.clear();
      s.slot1.clear();
      s.evicted = 0;
    }
  }

  /// Replaces the rows of `ids` (distinct, held here; a hashed row created, within the shard's
  /// capacity) by tensors (values of every row, then each slot's) and, hashed, sets when each was
  /// last touched from its age.
  void restore_rows(std::uint32_t table_id, std::span<const std::uint64_t> ids, std::span<const float> tensors,
                    std::span<const std::uint64_t> ages) {
    auto& t = table(table_id);
    const std::size_t dim = t.layout.spec.dim, n = ids.size();
    if (tensors.size() != n * dim * (1 + t.num_slots) || ages.size() != (t.layout.spec.hashed() ? n : 0))
      throw error(errc::internal, "restore_rows: rows of the wrong size");
    for_each_shard(t, ids, [&](sparse_shard& s, std::span<const std::size_t> at) {
      float* dst[] = {s.values.data(), s.slot0.data(), s.slot1.data()};
      for (auto i : at) {
        const std::uint64_t r = row(t, s, ids[i], true);
        if (t.layout.spec.hashed()) {  // row() may have grown the shard
          dst[0] = s.values.data(), dst[1] = s.slot0.data(), dst[2] = s.slot1.data();
          const std::uint64_t clock = std::uint64_t(s.iterations);
          s.last_seen[r] = clock - std::min(ages[i], clock);
        }
        for (std::size_t k = 0; k <= t.num_slots; ++k)
          std::memcpy(dst[k] + r * dim, tensors.data() + (k * n + i) * dim, dim * sizeof(float));
      }
    });
  }

  /// The row of `id` in shard s (locked by the caller): fixed, its local row; hashed, found or
  /// (create) made from the initialiser. Errors: out_of_range for an id not in s; hashed,
  /// invalid_argument when the shard is full.
  static std::uint64_t row(sparse_table& t, sparse_shard& s, std::uint64_t id, bool create) {
    const auto& l = t.layout;
    const auto p = l.place(id);
    if (p.shard != s.index) throw error(errc::internal, "row routed to another shard");
    if (!l.spec.hashed()) return p.local;
    const std::uint64_t clock = std::uint64_t(s.iterations);
    if (auto it = s.row_of.find(id); it != s.row_of.end()) {
      s.last_seen[it->second] = clock;
      return it->second;
    }
    if (!create) throw error(errc::out_of_range, "embedding '" + l.spec.name + "': id " + std::to_string(id) + " has no row");
    std::uint32_t r;
    const std::uint32_t dim = l.spec.dim;
    if (!s.free_rows.empty()) {
      r = s.free_rows.back();
      s.free_rows.pop_back();
    } else {
      if (s.id_of_row.size() >= s.capacity)
        throw error(errc::invalid_argument, "embedding '" + l.spec.name + "': shard " + std::to_string(s.index) +
                                                " is full (" + std::to_string(s.capacity) +
                                                " rows; raise max_rows or set evict_after)");
      r = std::uint32_t(s.id_of_row.size());
      s.id_of_row.push_back(0);
      s.last_seen.push_back(0);
      s.values.resize(s.values.size() + dim);
      if (t.num_slots >= 1) s.slot0.resize(s.values.size());
      if (t.num_slots >= 2) s.slot1.resize(s.values.size());
    }
    s.id_of_row[r] = id;
    s.last_seen[r] = clock;
    s.row_of.emplace(id, r);
    l.spec.init(id, std::span<float>(s.values).subspan(std::size_t(r) * dim, dim));
    const float init = optim::detail::slot_initial_value(t.rule);
    if (t.num_slots >= 1) std::fill_n(s.slot0.begin() + std::size_t(r) * dim, dim, init);
    if (t.num_slots >= 2) std::fill_n(s.slot1.begin() + std::size_t(r) * dim, dim, init);
    return r;
  }

 private:
  // Groups the positions of ids by shard (each held here, each id once), then calls
  // f(shard, positions) under each shard's lock.
  template <class F>
  void for_each_shard(sparse_table& t, std::span<const std::uint64_t> ids, F&& f) {
    // One sort by (shard, id) groups the positions by shard and puts a repeated id next to itself.
    struct entry {
      std::uint32_t shard;
      std::uint64_t id;
      std::size_t at;
    };
    std::vector<entry> order(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto p = t.layout.place(ids[i]);  // out_of_range names the table and the id
      if (!t.shards.count(p.shard))
        throw error(errc::invalid_argument, "embedding '" + t.layout.spec.name + "': id " + std::to_string(ids[i]) +
                                                " belongs to shard " + std::to_string(p.shard) + ", not held here");
      order[i] = {p.shard, ids[i], i};
    }
    std::sort(order.begin(), order.end(),
              [](const entry& a, const entry& b) { return a.shard != b.shard ? a.shard < b.shard : a.id < b.id; });
    std::vector<std::size_t> at(ids.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (i > 0 && order[i].id == order[i - 1].id)
        throw error(errc::invalid_argument, "embedding '" + t.layout.spec.name + "': id " + std::to_string(order[i].id) +
                                                " appears twice in one request");
      at[i] = order[i].at;
    }
    for (std::size_t b = 0, e = 0; b < order.size(); b = e) {
      while (e < order.size() && order[e].shard == order[b].shard) ++e;
      auto& s = *t.shards.at(order[b].shard);
      std::lock_guard g(s.mu);
      f(s, std::span<const std::size_t>(at).subspan(b, e - b));
    }
  }

  template <class Kernel>
  static void apply_rows(sparse_table& t, sparse_shard& s, std::span<const std::uint64_t> ids,
                         std::span<const float> rows, std::span<const std::size_t> at, Kernel k) {
    const std::uint32_t dim = t.layout.spec.dim;
    for (auto i : at) {
      const std::size_t r = std::size_t(row(t, s, ids[i], true)) * dim;
      optim::detail::host_apply(k, s.values.data() + r, rows.data() + i * dim,
                                s.slot0.empty() ? nullptr : s.slot0.data() + r,
                                s.slot1.empty() ? nullptr : s.slot1.data() + r, dim);
    }
  }

  static void evict(sparse_table& t, sparse_shard& s) {
    const std::uint64_t clock = std::uint64_t(s.iterations), after = t.layout.spec.evict_after;
    for (std::uint32_t r = 0; r < s.id_of_row.size(); ++r) {
      auto it = s.row_of.find(s.id_of_row[r]);
      if (it == s.row_of.end() || it->second != r) continue;  // a free row
      if (clock - s.last_seen[r] > after) {
        s.row_of.erase(it);
        s.free_rows.push_back(r);
        ++s.evicted;
      }
    }
  }

  std::map<std::uint32_t, sparse_table> tables_;
  std::uint64_t bytes_ = 0;
};

}  // namespace dtf::ps_detail
