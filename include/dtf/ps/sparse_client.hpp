// dtf/ps/sparse_client.hpp — a worker's view of the embedding tables on the parameter servers.
//
//   dtf::embedding_tables tables(client);               // over a connected ps_client
//   auto words = tables.add_fixed({.name = "words", .rows = 10'000'000, .dim = 20},
//                                 dtf::partitioners::fixed_size{3});
//   if (chief) tables.create(words, dtf::optim::adagrad{.learning_rate = 0.1f});  // before initialize()
//   auto l = tables.plan(words, batch_ids);             // distinct ids, grouped by ps
//   tables.gather(l, rows);                             // l.unique.size() * dim floats
//   ... forward/backward: row gradients for l.unique ...
//   tables.push(l, row_grads);
//
// A batch's ids are deduplicated on the worker (plan), each ps gets one request with its ids,
// and its reply lands in place in the rows buffer (no copy on the worker). Only the rows a batch
// touches cross the wire: ids * 8 bytes out, rows * dim * 4 bytes back for a gather and the same
// plus the ids for a push.
//
// Every task registers the same tables in the same order (add_*): the handle is the table's id
// on the wire. Thread safety: as the ps_client's (one thread).
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/ps/client.hpp>
#include <dtf/ps/embedding_layout.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace dtf {

/// The rows one batch touches in one table: distinct ids grouped by ps (ps 0's first).
struct lookup {
  /// The table's handle.
  std::uint32_t table = 0;
  /// Floats per row.
  std::uint32_t dim = 0;
  std::vector<std::uint64_t> unique;  ///< distinct ids; ps p's are unique[ps_begin[p], ps_begin[p + 1])
  std::vector<std::uint32_t> index;   ///< per id of the batch, its row in unique
  std::vector<std::size_t> ps_begin;  ///< num_ps + 1 offsets into unique
  /// The number of distinct rows.
  std::size_t rows() const noexcept { return unique.size(); }
};

/// A worker's view of the embedding tables on the parameter servers: registers and creates
/// tables, plans a batch's lookups (distinct ids grouped by ps), gathers their rows and pushes
/// their gradients.
class embedding_tables {
 public:
  /// A view over the connected client `ps`.
  explicit embedding_tables(ps_client& ps) : ps_(ps) {}

  /// Registers a fixed table cut by partitioner p. Returns its handle.
  template <partitioner P>
  std::uint32_t add_fixed(const embedding_spec& spec, const P& p) {
    return add(embedding_layout::fixed(spec, p, ps_.layout().num_ps));
  }
  /// Registers a hashed table of num_shards shards (0: one per ps).
  std::uint32_t add_hashed(const embedding_spec& spec, std::size_t num_shards = 0) {
    const std::size_t n = ps_.layout().num_ps;
    return add(embedding_layout::hashed(spec, num_shards == 0 ? n : num_shards, n));
  }
  /// Registers a table laid out by `layout`. Returns its handle. Errors: errc::invalid_argument
  /// for a name registered twice, errc::invalid_config for a layout over another number of ps.
  std::uint32_t add(embedding_layout layout) {
    for (const auto& l : layouts_)
      if (l.spec.name == layout.spec.name)
        throw error(errc::invalid_argument, "embedding '" + l.spec.name + "' registered twice");
    if (layout.num_ps != ps_.layout().num_ps)
      throw error(errc::invalid_config, "embedding '" + layout.spec.name + "': laid out over " +
                                            std::to_string(layout.num_ps) + " ps, the client has " +
                                            std::to_string(ps_.layout().num_ps));
    layouts_.push_back(std::move(layout));
    rules_.emplace_back();
    return std::uint32_t(layouts_.size() - 1);
  }

  /// The layout of table `table`.
  const embedding_layout& layout(std::uint32_t table) const { return layouts_.at(table); }
  /// The number of tables registered.
  std::size_t size() const noexcept { return layouts_.size(); }
  /// The update rule this task created the table with (create), or nullptr before that.
  const optim::rule* rule(std::uint32_t table) const {
    const auto& r = rules_.at(table);
    return r ? &*r : nullptr;
  }

  /// The chief: creates the table on every ps with update rule `rule` (each ps initialises its
  /// rows itself). A ps that already holds it (a restarted chief) keeps its rows. The rule is
  /// remembered (rule()): restore_tables creates the table again on a ps that lost it.
  void create(std::uint32_t table, const optim::rule& rule) {
    const auto& l = layout(table);
    rules_.at(table) = rule;
    std::vector<rpc_call> calls;
    for (std::size_t p = 0; p < l.num_ps; ++p) {
      detail::ps_embedding_init_msg m{table,
                                      l.spec.name,
                                      l.spec.rows,
                                      l.spec.dim,
                                      std::uint8_t(l.spec.strategy),
                                      l.spec.init.scale,
                                      l.spec.init.seed,
                                      l.spec.max_rows,
                                      l.spec.evict_after,
                                      l.shards.size(),
                                      l.num_ps,
                                      p,
                                      detail::rule_msg::from(rule)};
      calls.push_back(ps_.request(p, detail::message_kind::ps_embedding_init, detail::encode_message(m)));
    }
    ps_.call_all(calls);
  }

  /// The distinct ids of `ids` grouped by ps. Errors: out_of_range naming the table and an id
  /// outside a fixed table.
  lookup plan(std::uint32_t table, std::span<const std::uint64_t> ids) const {
    lookup out;
    plan(table, ids, out);
    return out;
  }
  /// The same into `out`, reusing its buffers (a worker's plan per step allocates nothing once
  /// its buffers have grown).
  void plan(std::uint32_t table, std::span<const std::uint64_t> ids, lookup& out) const {
    const auto& l = layout(table);
    out.table = table;
    out.dim = l.spec.dim;
    // Scratch kept between calls: id -> position in seen_, and each distinct id's ps.
    first_.clear();
    first_.reserve(ids.size());
    seen_.clear();
    ps_of_.clear();
    out.index.resize(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      auto [it, fresh] = first_.try_emplace(ids[i], std::uint32_t(seen_.size()));
      if (fresh) {
        seen_.push_back(ids[i]);
        ps_of_.push_back(std::uint32_t(l.shards[l.place(ids[i]).shard].ps));
      }
      out.index[i] = it->second;
    }
    // Counting sort by ps (stable: first-seen order within a ps); moved_[u]: seen_[u]'s place.
    out.ps_begin.assign(l.num_ps + 1, 0);
    for (auto p : ps_of_) ++out.ps_begin[p + 1];
    for (std::size_t p = 0; p < l.num_ps; ++p) out.ps_begin[p + 1] += out.ps_begin[p];
    next_.assign(out.ps_begin.begin(), out.ps_begin.end() - 1);
    moved_.resize(seen_.size());
    out.unique.resize(seen_.size());
    for (std::size_t u = 0; u < seen_.size(); ++u) {
      const std::size_t to = next_[ps_of_[u]]++;
      out.unique[to] = seen_[u];
      moved_[u] = std::uint32_t(to);
    }
    for (auto& x : out.index) x = moved_[x];
  }

  /// Reads the rows of l.unique into rows (l.rows() * dim floats, row r for l.unique[r]).
  void gather(const lookup& l, std::span<float> rows) {
    check(l, rows.size(), "gather");
    std::vector<rpc_call> calls;
    for (std::size_t p = 0; p + 1 < l.ps_begin.size(); ++p) {
      const std::size_t b = l.ps_begin[p], e = l.ps_begin[p + 1];
      if (b == e) continue;
      auto c = ps_.request(p, detail::message_kind::ps_gather, detail::encode_message(detail::ps_gather_msg{l.table, e - b}));
      c.payload.push_back(asio::buffer(l.unique.data() + b, (e - b) * sizeof(std::uint64_t)));
      c.reply_payload.push_back(asio::buffer(rows.data() + b * l.dim, (e - b) * l.dim * sizeof(float)));
      calls.push_back(std::move(c));
    }
    ps_.call_all(calls);
  }

  /// Sends one row per id of l.unique: gradients the table's rule applies (at learning_rate
  /// when given), or, with delta, values added.
  void push(const lookup& l, std::span<const float> rows, std::optional<float> learning_rate = std::nullopt,
            bool delta = false) {
    check(l, rows.size(), "push");
    std::vector<rpc_call> calls;
    for (std::size_t p = 0; p + 1 < l.ps_begin.size(); ++p) {
      const std::size_t b = l.ps_begin[p], e = l.ps_begin[p + 1];
      if (b == e) continue;
      auto c = ps_.request(p, detail::message_kind::ps_sparse_push,
                           detail::encode_message(detail::ps_sparse_push_msg{l.table, e - b, delta, learning_rate}));
      c.payload.push_back(asio::buffer(l.unique.data() + b, (e - b) * sizeof(std::uint64_t)));
      c.payload.push_back(asio::buffer(rows.data() + b * l.dim, (e - b) * l.dim * sizeof(float)));
      calls.push_back(std::move(c));
    }
    ps_.call_all(calls);
  }

  /// Rows held over all ps (a hashed table: created and not evicted), and rows evicted.
  struct row_counts {
    /// Rows held, and rows evicted.
    ///@{
    std::uint64_t held = 0, evicted = 0;
    ///@}
  };
  /// The row counts of table `table`, over all ps.
  row_counts rows(std::uint32_t table) {
    std::vector<rpc_call> calls;
    for (std::size_t p = 0; p < ps_.layout().num_ps; ++p)
      calls.push_back(ps_.request(p, detail::message_kind::ps_sparse_stats, detail::encode_message(detail::empty_msg{})));
    ps_.call_all(calls);
    row_counts r;
    for (const auto& c : calls) {
      const auto m = detail::decode_message<detail::ps_sparse_stats_msg>(c.reply_meta, "sparse stats");
      for (std::size_t i = 0; i < m.tables.size() && i < m.rows.size() && i < m.evicted.size(); ++i)
        if (m.tables[i] == table) r.held += m.rows[i], r.evicted += m.evicted[i];
    }
    return r;
  }

 private:
  void check(const lookup& l, std::size_t floats, const char* what) const {
    if (l.table >= layouts_.size() || l.dim != layouts_[l.table].spec.dim ||
        l.ps_begin.size() != layouts_[l.table].num_ps + 1 || l.ps_begin.back() != l.unique.size())
      throw error(errc::invalid_argument, std::string("embedding_tables::") + what + ": a lookup of another table");
    if (floats != l.unique.size() * l.dim)
      throw error(errc::shape_mismatch, std::string("embedding_tables::") + what + ": " + std::to_string(floats) +
                                            " floats for " + std::to_string(l.unique.size()) + " rows of dim " +
                                            std::to_string(l.dim));
  }

  ps_client& ps_;
  std::vector<embedding_layout> layouts_;
  std::vector<std::optional<optim::rule>> rules_;  // per table, once created here
  // plan()'s scratch
  mutable std::unordered_map<std::uint64_t, std::uint32_t> first_;
  mutable std::vector<std::uint64_t> seen_;
  mutable std::vector<std::uint32_t> ps_of_, moved_;
  mutable std::vector<std::size_t> next_;
};

}  // namespace dtf
