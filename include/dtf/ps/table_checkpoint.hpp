// dtf/ps/table_checkpoint.hpp — checkpoints of embedding tables (dtf/ps/sparse_client.hpp) over a
// ps cluster.
//
// Save: every ps that holds a table writes its own table file at save_checkpoint (beside its
// shard file; dtf/checkpoint/table_file.hpp): each table's spec, rule and, per shard it holds,
// the shard's push count (Adam's t) and its rows (a fixed shard all of them, a hashed shard its
// live rows with their ages for eviction), values and slots. The chief lists the tables and the
// table files in the manifest (saved_tables below).
//
// Restore: restore_tables streams every saved row, a chunk of about 4 MiB at a time, to the ps
// that holds it under the *restoring* run's layout (its number of ps and shards), so a checkpoint
// saved by 2 ps restores into 1 or 3. A table's shards first take their push counts: shard j's own
// when the shard count (and a fixed table's partition strategy) is unchanged, else the largest of
// the saved shards' (as the dense restore does per variable); a hashed table is emptied, then
// holds exactly the saved rows (each within its new shard's capacity, max_rows / shards).
//
// Thread safety: as the ps_client's (one thread). Errors: errc::invalid_argument naming the table
// (not created before the restore, missing from the checkpoint, another kind, rows or rule),
// shape_mismatch (another dim), corrupt_data / io_error naming the file and field (a damaged or
// crafted table file; rows read before it stay restored), the ps's errors (a hashed shard full).
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/ps/client.hpp>
#include <dtf/ps/sparse_client.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace dtf {

namespace detail {

/// What the ps tasks report of their tables at a save, checked and merged for the manifest: the
/// same spec and rule from every ps, every shard of every table saved by exactly one ps.
class saved_tables {
 public:
  void add(const ps_saved_msg& r, std::size_t ps) {
    if (r.table_file.empty()) return;
    files_.push_back({r.table_file, ps, r.table_bytes, r.table_sha256});
    const std::string what = "the save reply of ps." + std::to_string(ps);
    for (std::size_t i = 0; i < r.tables.size(); ++i) {
      const auto j = ckpt::parse_json(r.tables[i], what);
      const auto path = ckpt::item("tables", i);
      auto t = ckpt::parse_table(j, what, path);
      t.rows_saved = ckpt::u64_at(j, "rows_saved", what, path);
      auto [it, fresh] = tables_.try_emplace(t.spec.name, entry{t, std::vector<bool>(std::size_t(t.num_shards))});
      auto& e = it->second;
      if (!fresh && !e.table.same_table(t))
        throw error(errc::invalid_argument, "save_checkpoint: embedding '" + t.spec.name + "' differs between the ps");
      if (!fresh) e.table.rows_saved += t.rows_saved;  // each bounded by its shards' capacity
      const auto& shards = ckpt::array_at(j, "shards", what, path);
      for (std::size_t k = 0; k < shards.size(); ++k) {
        const auto s = ckpt::as_u64(shards[k], what, path + ".shards");
        if (s >= e.saved.size() || e.saved[std::size_t(s)])
          throw error(errc::invalid_argument, "save_checkpoint: shard " + std::to_string(s) + " of embedding '" +
                                                  t.spec.name + "' saved twice or outside the table");
        e.saved[std::size_t(s)] = true;
      }
      if (fresh) order_.push_back(t.spec.name);
    }
  }

  /// Lists the tables and table files in `m`. Errors: invalid_argument for a table with shards
  /// that no ps saved (a ps that restarted without its tables).
  void finish(checkpoint_manifest& m) const {
    for (const auto& name : order_) {
      const auto& e = tables_.at(name);
      if (std::find(e.saved.begin(), e.saved.end(), false) != e.saved.end())
        throw error(errc::invalid_argument, "save_checkpoint: no ps saved some shards of embedding '" + name +
                                                "' (a ps that restarted without it? restore_latest with the tables)");
      m.tables.push_back(e.table);
    }
    m.table_files = files_;
  }

 private:
  struct entry {
    checkpoint_table table;
    std::vector<bool> saved;
  };
  std::map<std::string, entry> tables_;
  std::vector<std::string> order_;
  std::vector<checkpoint_table_file> files_;
};

// Checks the restoring run's table `l` (rule `rule`) against the saved one.
inline void check_restore(const checkpoint_manifest& man, const checkpoint_table& saved, const embedding_layout& l,
                          const optim::rule& rule) {
  const auto& name = l.spec.name;
  const std::string in = "embedding '" + name + "' of checkpoint " + man.name;
  if (saved.spec.hashed() != l.spec.hashed())
    throw error(errc::invalid_argument, in + " is a " + (saved.spec.hashed() ? "hashed" : "fixed") +
                                            " table, the restoring run's a " + (l.spec.hashed() ? "hashed" : "fixed") + " one");
  if (!l.spec.hashed() && saved.spec.rows != l.spec.rows)
    throw error(errc::invalid_argument, in + " has " + std::to_string(saved.spec.rows) + " rows, the restoring run's " +
                                            std::to_string(l.spec.rows));
  if (saved.spec.dim != l.spec.dim)
    throw error(errc::shape_mismatch, in + " has dim " + std::to_string(saved.spec.dim) + ", the restoring run's " +
                                          std::to_string(l.spec.dim));
  const std::size_t slots = optim::detail::slot_count(rule);
  const std::string rule_name = std::visit([](const auto& r) { return std::string(std::decay_t<decltype(r)>::name); }, rule);
  if (slots != saved.num_slots || (slots != 0 && rule_name != saved.rule))
    throw error(errc::invalid_config, in + " holds the slots of rule " + saved.rule + ", the restoring run uses " + rule_name);
}

// Restores table `id` of `tables` from the saved table `saved` of `ck` (see the file comment).
inline void restore_table(ps_client& client, const embedding_tables& tables, std::uint32_t id,
                          const checkpoint_reader& ck, const checkpoint_table& saved) {
  const auto& l = tables.layout(id);
  const std::string& name = l.spec.name;
  std::vector<std::int64_t> saved_it(std::size_t(saved.num_shards), 0);
  for (const auto& f : ck.table_files())
    for (const auto& ft : f.header().tables)
      if (ft.table.spec.name == name)
        for (const auto& s : ft.shards) saved_it[s.index] = s.iterations;
  const std::int64_t most = *std::max_element(saved_it.begin(), saved_it.end());
  const bool same_shards = l.shards.size() == saved.num_shards && l.spec.strategy == saved.spec.strategy;
  std::vector<rpc_call> calls;
  for (std::size_t p = 0; p < l.num_ps; ++p) {
    ps_sparse_restore_msg m{id, true, {}, {}, 0, saved.num_slots, ck.manifest().name};
    for (std::uint32_t j = 0; j < l.shards.size(); ++j)
      if (l.shards[j].ps == p) m.shards.push_back(j), m.iterations.push_back(same_shards ? saved_it[j] : most);
    calls.push_back(client.request(p, message_kind::ps_sparse_restore, encode_message(m)));
  }
  client.call_all(calls);
  // Rows, a chunk at a time: each chunk's rows grouped by the ps that holds them now.
  const std::size_t dim = l.spec.dim, tensors = 1 + saved.num_slots;
  const bool hashed = l.spec.hashed();
  ckpt::table_rows rows;
  std::vector<std::vector<std::size_t>> of_ps(l.num_ps);
  std::vector<std::vector<std::byte>> payloads(l.num_ps);
  for (const auto& f : ck.table_files())
    for (std::size_t t = 0; t < f.header().tables.size(); ++t) {
      if (f.header().tables[t].table.spec.name != name) continue;
      for (std::size_t s = 0; s < f.header().tables[t].shards.size(); ++s)
        for (ckpt::table_file_reader::cursor c{t, s, 0, {}}; f.read(c, ckpt::chunk_rows(saved), rows);) {
          for (auto& v : of_ps) v.clear();
          for (std::size_t r = 0; r < rows.size(); ++r) of_ps[l.shards[l.place(rows.ids[r]).shard].ps].push_back(r);
          calls.clear();
          for (std::size_t p = 0; p < l.num_ps; ++p) {
            const auto& at = of_ps[p];
            if (at.empty()) continue;
            auto& out = payloads[p];
            out.resize(at.size() * (8 + tensors * dim * sizeof(float) + (hashed ? 8 : 0)));
            std::byte* w = out.data();
            for (auto r : at) std::memcpy(w, &rows.ids[r], 8), w += 8;
            for (std::size_t k = 0; k < tensors; ++k)
              for (auto r : at) {
                std::memcpy(w, rows.tensors.data() + (k * rows.size() + r) * dim, dim * sizeof(float));
                w += dim * sizeof(float);
              }
            if (hashed)
              for (auto r : at) std::memcpy(w, &rows.ages[r], 8), w += 8;
            ps_sparse_restore_msg m{id, false, {}, {}, at.size(), saved.num_slots, ck.manifest().name};
            auto call = client.request(p, message_kind::ps_sparse_restore, encode_message(m));
            call.payload.push_back(asio::buffer(out));
            calls.push_back(std::move(call));
          }
          client.call_all(calls);
        }
    }
}

}  // namespace detail

/// Restores every table of `tables` (the restoring run's, each created first with
/// embedding_tables::create: its rule is the restoring run's) from the verified checkpoint `ck`
/// (opened with checkpoint_reader::open or open_tables), re-routing rows to this client's ps (see
/// the file comment). Tables the checkpoint holds and `tables` lacks are left out.
inline void restore_tables(ps_client& client, embedding_tables& tables, const checkpoint_reader& ck) {
  const auto& man = ck.manifest();
  if (ck.table_files().size() != man.table_files.size())
    throw error(errc::invalid_argument, "restore_tables: checkpoint " + man.name + " was opened without its table files");
  for (std::uint32_t id = 0; id < tables.size(); ++id) {
    const auto& l = tables.layout(id);
    if (l.num_ps != client.layout().num_ps)
      throw error(errc::invalid_argument, "restore_tables: embedding '" + l.spec.name + "' is laid out over " +
                                              std::to_string(l.num_ps) + " ps, the client has " +
                                              std::to_string(client.layout().num_ps));
    const auto* rule = tables.rule(id);
    if (!rule)
      throw error(errc::invalid_argument, "restore of embedding '" + l.spec.name +
                                              "': create it (embedding_tables::create) before restoring it");
    const auto* saved = man.find_table(l.spec.name);
    if (!saved) {
      std::string known;
      for (const auto& t : man.tables) known += (known.empty() ? "" : ", ") + t.spec.name;
      throw error(errc::invalid_argument, "checkpoint " + man.name + " holds no embedding table '" + l.spec.name +
                                              "' (it holds: " + (known.empty() ? "none" : known) + ")");
    }
    detail::check_restore(man, *saved, l, *rule);
    tables.create(id, *rule);  // a ps that lost the table (restarted) holds it again; the others keep it
    detail::restore_table(client, tables, id, ck, *saved);
  }
}

/// Restores the tables from checkpoint `name` of `directory` (verified: the manifest and the
/// table files; no shard file is read). See restore_tables above.
inline void restore_tables(ps_client& client, embedding_tables& tables, const std::string& directory,
                           const std::string& name) {
  restore_tables(client, tables, checkpoint_reader::open_tables(directory, name));
}

}  // namespace dtf
