// dtf/ps/sparse_service.hpp — the ps's requests on embedding tables: embedding init, gather,
// sparse push, sparse stats, sparse restore (messages in dtf/detail/messages.hpp; rows in
// sparse_store.hpp), and the tables' part of a checkpoint (save: this ps's table file,
// dtf/checkpoint/table_file.hpp).
//
// Each request is checked before anything is allocated for it: a table's creation against
// ps_options::max_sparse_bytes, a gather's reply against the transport's payload limit, a
// push's payload against its count and the table's dim. Ids and rows are read in place from
// the request's payload (copied only if the payload is not aligned for them).
//
// Thread safety: a shared_mutex over the tables (creation exclusive, everything else shared);
// each shard locks its own rows.
#pragma once

#include <dtf/checkpoint/writer.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/shard_store.hpp>
#include <dtf/ps/sparse_store.hpp>
#include <dtf/ps/sync_aggregator.hpp>
#include <dtf/transport.hpp>

#include <cstring>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

namespace dtf::ps_detail {

class sparse_service {
 public:
  explicit sparse_service(const ps_options& options) : options_(options) {}

  /// The most payload bytes a sparse request may carry, before it is read (the transport's
  /// payload_limit): a gather, push or restore of a table names at most as many rows as this ps
  /// holds of it (its ids are distinct). Table creation bounds those rows by max_sparse_bytes,
  /// so the products below cannot wrap. Errors: the table is not held here, a malformed meta.
  std::uint64_t payload_limit(detail::message_kind kind, std::span<const std::byte> meta) {
    using detail::message_kind;
    std::shared_lock lock(mu_);
    // The rows held here of t, and an error when a request names more.
    auto rows_here = [](const sparse_table& t, std::uint64_t count, const char* what) {
      std::uint64_t n = 0;
      for (const auto& [j, s] : t.shards) n += s->capacity;
      if (count > n)
        throw error(errc::invalid_argument,
                    std::string(what) + " of " + std::to_string(count) + " rows of embedding '" + t.layout.spec.name +
                        "': this ps holds at most " + std::to_string(n) +
                        (t.layout.spec.hashed() ? " (the table would be full; raise max_rows or set evict_after)" : ""));
      return n;
    };
    switch (kind) {
      case message_kind::ps_gather: {
        const auto m = detail::decode_message<detail::ps_gather_msg>(meta, "gather");
        const auto& t = store_.table(m.table);
        return rows_here(t, m.count, "gather") * sizeof(std::uint64_t);
      }
      case message_kind::ps_sparse_push: {
        const auto m = detail::decode_message<detail::ps_sparse_push_msg>(meta, "sparse push");
        const auto& t = store_.table(m.table);
        return rows_here(t, m.count, "sparse push") *
               (sizeof(std::uint64_t) + std::uint64_t(t.layout.spec.dim) * sizeof(float));
      }
      case message_kind::ps_sparse_restore: {
        const auto m = detail::decode_message<detail::ps_sparse_restore_msg>(meta, "sparse restore");
        if (m.begin) return 0;
        const auto& t = store_.table(m.table);
        return rows_here(t, m.count, "sparse restore") * (8 + std::uint64_t(t.layout.spec.dim) * sizeof(float) * (1 + t.num_slots) +
                               (t.layout.spec.hashed() ? 8 : 0));
      }
      case message_kind::ps_sync_push:
      case message_kind::ps_sync_stage: {  // its rows (the server adds the dense part)
        // The rows it names (each table once, at most the rows held of it), not the tables'
        // capacities: a meta of many parts cannot inflate the bound.
        const auto m = detail::decode_message<detail::ps_sync_push_msg>(meta, "sync push");
        std::uint64_t bytes = 0;
        std::set<std::uint32_t> seen;
        for (const auto& p : m.rows) {
          const auto& t = store_.table(p.table);
          if (!seen.insert(p.table).second)
            throw error(errc::invalid_argument, "synchronous contribution: embedding '" + t.layout.spec.name +
                                                    "' named twice");
          rows_here(t, p.count, "synchronous contribution");
          bytes += p.count * (sizeof(std::uint64_t) + std::uint64_t(t.layout.spec.dim) * sizeof(float));
        }
        return bytes;
      }
      default: return 0;  // embedding init and stats carry no payload
    }
  }

  /// The rows of a synchronous contribution: `bytes`, the payload after its dense part, holds
  /// per part count ids then count * dim floats, consumed exactly; each part's table held here
  /// and named once. The views point into `bytes` (ids copied when unaligned). The ids
  /// themselves are checked when the aggregator records the contribution (reserve_rows).
  struct parsed_rows {
    std::vector<contributed_rows> parts;
    std::vector<std::vector<std::uint64_t>> copies;  // unaligned ids
  };
  parsed_rows sync_rows(const rpc_peer& peer, const std::vector<detail::sync_rows_part>& parts,
                        std::span<const std::byte> bytes) {
    std::shared_lock lock(mu_);
    parsed_rows out;
    std::size_t at = 0;
    for (const auto& p : parts) {
      const auto& t = store_.table(p.table);
      const std::uint32_t dim = t.layout.spec.dim;
      for (const auto& q : out.parts)
        if (q.table == p.table)
          throw error(errc::invalid_argument, "synchronous contribution of " + peer.identity + ": embedding '" +
                                                  t.layout.spec.name + "' named twice");
      const std::uint64_t row_bytes = sizeof(std::uint64_t) + std::uint64_t(dim) * sizeof(float);
      if (p.count > (bytes.size() - at) / row_bytes)
        throw error(errc::shape_mismatch, "synchronous contribution of " + peer.identity + ": " +
                                              std::to_string(p.count) + " rows of '" + t.layout.spec.name + "' in " +
                                              std::to_string(bytes.size() - at) + " bytes left");
      const std::size_t n = std::size_t(p.count);
      out.copies.emplace_back();
      const auto ids = view(bytes, at, n, out.copies.back());
      std::vector<float> unused;  // rows follow ids: 4-aligned wherever the ids are
      const auto rows = view(bytes, at + n * sizeof(std::uint64_t), n * dim, unused);
      if (!unused.empty()) throw error(errc::internal, "synchronous contribution: unaligned rows");
      out.parts.push_back({p.table, dim, ids, rows});
      at += n * row_bytes;
    }
    if (at != bytes.size())
      throw error(errc::shape_mismatch, "synchronous contribution of " + peer.identity + ": " +
                                            std::to_string(bytes.size() - at) + " payload bytes past its rows");
    return out;
  }

  /// The aggregator's table store (sync_aggregator::contribute): checks a contribution's ids and
  /// makes a hashed table's missing rows; applies a step's averaged rows. The ids were checked
  /// and their rows made when recorded, so an apply can fail only if a hashed table was filled
  /// meanwhile by other requests: that is logged, and the step goes on (no peer can end it so).
  void reserve_rows(std::span<const contributed_rows> parts) {
    std::shared_lock lock(mu_);
    for (const auto& p : parts) store_.check_ids(p.table, p.ids);  // every part before any row is made
    for (const auto& p : parts) store_.touch(p.table, p.ids);       // only a full hashed table fails here
  }
  void apply_rows(std::uint32_t table, std::span<const std::uint64_t> ids, std::span<const float> rows,
                  bool delta) noexcept {
    try {
      std::shared_lock lock(mu_);
      store_.push(table, ids, rows, delta, std::nullopt);
    } catch (const std::exception& e) {
      detail::log_line(options_.transport, "dtf " + options_.transport.identity +
                                               ": a synchronous step's rows of embedding table " +
                                               std::to_string(table) + " were not all applied: " + e.what());
    }
  }

  /// Handles one sparse request. Sets reply.meta (stats) or leaves it for the server's status
  /// reply; returns true when a push was skipped (non-finite rows, nonfinite_policy::skip).
  bool handle(const rpc_peer& peer, detail::message_kind kind, std::span<const std::byte> meta,
              std::span<std::byte> payload, rpc_reply& reply) {
    using detail::message_kind;
    switch (kind) {
      case message_kind::ps_embedding_init:
        create(peer, detail::decode_message<detail::ps_embedding_init_msg>(meta, "embedding init"));
        return false;
      case message_kind::ps_gather:
        gather(peer, detail::decode_message<detail::ps_gather_msg>(meta, "gather"), payload, reply);
        return false;
      case message_kind::ps_sparse_push:
        return push(peer, detail::decode_message<detail::ps_sparse_push_msg>(meta, "sparse push"), payload);
      case message_kind::ps_sparse_restore:
        restore(peer, detail::decode_message<detail::ps_sparse_restore_msg>(meta, "sparse restore"), payload);
        return false;
      default:
        stats(reply);
        return false;
    }
  }

  /// Whether this ps holds any table (then a save writes a table file).
  bool holds_tables() {
    std::shared_lock lock(mu_);
    return !store_.tables().empty();
  }

  /// Writes the tables this ps holds (if any) into a table file of checkpoint m.name in `dir`
  /// and records it in `out`: each table copied under its shards' locks, written outside them.
  void save(const std::string& dir, const detail::ps_save_msg& m, const checkpoint_fault& fault,
            detail::ps_saved_msg& out) {
    std::vector<detail::ckpt::table_snapshot> tables;
    {
      std::shared_lock lock(mu_);
      for (const auto& [id, t] : store_.tables()) tables.push_back(store_.snapshot(id));
    }
    if (tables.empty()) return;
    const auto f = detail::ckpt::write_table_file(dir, m.name, std::size_t(m.ps_index), std::size_t(m.num_ps), tables, fault);
    out.table_file = f.name;
    out.table_sha256 = f.sha256;
    out.table_bytes = f.bytes;
    std::uint64_t rows = 0;
    for (const auto& t : tables) {
      auto j = detail::ckpt::table_to_json(t.table);
      j["shards"] = nlohmann::json::array();
      std::uint64_t n = 0;
      for (const auto& s : t.shards) j["shards"].push_back(s.index), n += s.rows;
      j["rows_saved"] = n;
      rows += n;
      out.tables.push_back(j.dump());
    }
    detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": saved " +
                                             std::to_string(tables.size()) + " embedding tables (" + std::to_string(rows) +
                                             " rows) to " + dir + "/" + f.name + " (" + std::to_string(f.bytes) + " bytes)");
  }

 private:
  void create(const rpc_peer& peer, const detail::ps_embedding_init_msg& m) {
    if (m.strategy > std::uint8_t(partition_strategy::mod))
      throw error(errc::corrupt_data, "embedding init: unknown partition strategy " + std::to_string(m.strategy));
    if (m.num_ps == 0 || m.ps_index >= m.num_ps || m.num_shards == 0 || m.num_shards > (std::uint64_t(1) << 20) ||
        (m.rows > 0 && m.num_shards > m.rows))
      throw error(errc::invalid_argument, "embedding init: " + std::to_string(m.num_shards) + " shards over " +
                                              std::to_string(m.num_ps) + " ps for ps index " + std::to_string(m.ps_index));
    embedding_spec spec{m.name, m.rows, m.dim, partition_strategy(m.strategy), {m.init_scale, m.seed}, m.max_rows,
                        m.evict_after};
    auto layout = spec.hashed() ? embedding_layout::hashed(spec, m.num_shards, m.num_ps)
                                : embedding_layout::fixed(spec, partitioners::fixed_size{m.num_shards}, m.num_ps);
    std::unique_lock lock(mu_);
    store_.create(m.table, std::move(layout), m.rule.to_rule(), m.ps_index, options_.max_sparse_bytes);
    detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": embedding '" + spec.name + "' (" +
                                             (spec.hashed() ? "hashed" : std::to_string(spec.rows) + " rows") + " x " +
                                             std::to_string(spec.dim) + ", " + std::to_string(m.num_shards) +
                                             " shards) created by " + peer.identity);
  }

  // count values of T at byte `at` of the payload, in place when aligned (else copied to `copy`).
  template <class T>
  static std::span<const T> view(std::span<const std::byte> payload, std::size_t at, std::size_t count,
                                 std::vector<T>& copy) {
    const std::byte* p = payload.data() + at;
    if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) == 0) return {reinterpret_cast<const T*>(p), count};
    copy.resize(count);
    std::memcpy(copy.data(), p, count * sizeof(T));
    return copy;
  }

  // The ids of a gather or sparse push: count uint64s at the start of the payload.
  static std::span<const std::uint64_t> ids_in(std::span<const std::byte> payload, std::uint64_t count,
                                               std::vector<std::uint64_t>& copy, const char* what) {
    if (count > payload.size() / sizeof(std::uint64_t))
      throw error(errc::shape_mismatch, std::string(what) + ": " + std::to_string(count) + " ids in a payload of " +
                                            std::to_string(payload.size()) + " bytes");
    return view(payload, 0, std::size_t(count), copy);
  }

  void gather(const rpc_peer& peer, const detail::ps_gather_msg& m, std::span<const std::byte> payload,
              rpc_reply& reply) {
    std::shared_lock lock(mu_);
    const auto& t = store_.table(m.table);
    std::vector<std::uint64_t> copy;
    const auto ids = ids_in(payload, m.count, copy, "gather");
    if (payload.size() != ids.size() * sizeof(std::uint64_t))
      throw error(errc::shape_mismatch, "gather of " + peer.identity + ": " + std::to_string(payload.size()) +
                                            " payload bytes for " + std::to_string(m.count) + " ids");
    // The reply is bounded as a request would be (an id is 8 bytes, a row dim * 4).
    const std::uint64_t row_bytes = std::uint64_t(t.layout.spec.dim) * sizeof(float);
    if (m.count > options_.transport.limits.max_payload_bytes / row_bytes)
      throw error(errc::invalid_argument, "gather of " + peer.identity + ": " + std::to_string(m.count) + " rows of '" +
                                              t.layout.spec.name + "' exceed the payload limit");
    peer.scratch->resize(m.count * row_bytes);
    store_.gather(m.table, ids, {reinterpret_cast<float*>(peer.scratch->data()), peer.scratch->size() / sizeof(float)});
    reply.payload.push_back(asio::buffer(*peer.scratch));
  }

  bool push(const rpc_peer& peer, const detail::ps_sparse_push_msg& m, std::span<const std::byte> payload) {
    std::shared_lock lock(mu_);
    const auto& t = store_.table(m.table);
    const std::uint64_t row_bytes = std::uint64_t(t.layout.spec.dim) * sizeof(float);
    std::vector<std::uint64_t> id_copy;
    const auto ids = ids_in(payload, m.count, id_copy, "sparse push");
    const std::size_t id_bytes = ids.size() * sizeof(std::uint64_t);
    if ((payload.size() - id_bytes) % row_bytes != 0 || (payload.size() - id_bytes) / row_bytes != m.count)
      throw error(errc::shape_mismatch, "sparse push of " + peer.identity + ": " + std::to_string(payload.size()) +
                                            " payload bytes for " + std::to_string(m.count) + " rows of '" +
                                            t.layout.spec.name + "' (dim " + std::to_string(t.layout.spec.dim) + ")");
    std::vector<float> row_copy;
    const auto rows = view(payload, id_bytes, (payload.size() - id_bytes) / sizeof(float), row_copy);
    if (options_.nonfinite != nonfinite_policy::apply && !all_finite(rows)) {
      if (options_.nonfinite == nonfinite_policy::reject)
        throw error(errc::invalid_argument, "sparse push of " + peer.identity + " to '" + t.layout.spec.name +
                                                "' holds non-finite values: rejected");
      return true;
    }
    store_.push(m.table, ids, rows, m.delta, m.learning_rate);
    return false;
  }

  void restore(const rpc_peer& peer, const detail::ps_sparse_restore_msg& m, std::span<const std::byte> payload) {
    std::shared_lock lock(mu_);
    const auto& t = store_.table(m.table);
    const auto& spec = t.layout.spec;
    if (m.begin) {
      if (!payload.empty()) throw error(errc::corrupt_data, "sparse restore of '" + spec.name + "': a payload with begin");
      store_.reset(m.table, m.shards, m.iterations);
      detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": restoring embedding '" + spec.name +
                                               "' from checkpoint " + m.checkpoint.substr(0, 256) + ", sent by " +
                                               peer.identity);
      return;
    }
    if (m.num_slots != t.num_slots)
      throw error(errc::invalid_argument, "sparse restore of '" + spec.name + "': " + std::to_string(m.num_slots) +
                                              " slots sent, its rule has " + std::to_string(t.num_slots));
    // Per row: an id, (1 + slots) * dim floats, a hashed row's age; the count checked first
    // against the payload (no product of what the peer sent can wrap around).
    const std::uint64_t row_bytes =
        8 + std::uint64_t(spec.dim) * sizeof(float) * (1 + t.num_slots) + (spec.hashed() ? 8 : 0);
    if (m.count > payload.size() / row_bytes || m.count * row_bytes != payload.size())
      throw error(errc::shape_mismatch, "sparse restore of " + peer.identity + ": " + std::to_string(payload.size()) +
                                            " payload bytes for " + std::to_string(m.count) + " rows of '" + spec.name + "'");
    const std::size_t n = std::size_t(m.count), floats = n * spec.dim * (1 + t.num_slots);
    std::vector<std::uint64_t> id_copy, age_copy;
    std::vector<float> row_copy;
    const auto ids = view(payload, 0, n, id_copy);
    const auto rows = view(payload, n * 8, floats, row_copy);
    const auto ages = view(payload, n * 8 + floats * sizeof(float), spec.hashed() ? n : 0, age_copy);
    store_.restore_rows(m.table, ids, rows, ages);
  }

  void stats(rpc_reply& reply) {
    std::shared_lock lock(mu_);
    detail::ps_sparse_stats_msg out;
    for (const auto& [id, t] : store_.tables()) {
      out.tables.push_back(id);
      out.rows.push_back(store_.rows_held(id));
      out.evicted.push_back(store_.rows_evicted(id));
    }
    reply.meta = detail::encode_message(out);
  }

  const ps_options& options_;
  std::shared_mutex mu_;
  sparse_store store_;
};

}  // namespace dtf::ps_detail
