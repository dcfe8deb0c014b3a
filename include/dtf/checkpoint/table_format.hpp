// dtf/checkpoint/table_format.hpp — embedding tables (dtf/ps/embedding_layout.hpp) in a
// checkpoint: what the manifest says of each table and of each table file, and the checks every
// field passes (as the dense part's, dtf/checkpoint/format.hpp: closed sets, no wrap-around,
// counts against the files' sizes, names confined to the directory). The table files themselves
// are dtf/checkpoint/table_file.hpp's.
//
// In the manifest (both arrays absent in a checkpoint without tables):
//   "tables":      [{"name", "rows" (0: hashed), "dim", "strategy" ("div"|"mod"), "init_scale",
//                    "init_seed", "max_rows", "evict_after", "num_shards", "rule", "num_slots",
//                    "rows_saved"}, ...]
//   "table_files": [{"name", "ps", "bytes", "sha256"}, ...]   one per ps that held a table
//
// Thread safety: plain values and pure functions. Errors: errc::corrupt_data naming the file and
// the field.
#pragma once

#include <dtf/checkpoint/fields.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps/embedding_layout.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace dtf {

/// One embedding table in a checkpoint: its spec, shard count and update rule as saved.
struct checkpoint_table {
  /// The table's spec as saved.
  embedding_spec spec;
  /// The number of shards it was saved in.
  std::uint64_t num_shards = 1;
  /// The name of its update rule.
  std::string rule = "sgd";
  /// The number of slot buffers of that rule saved with the rows.
  std::size_t num_slots = 0;
  std::uint64_t rows_saved = 0;  ///< the manifest's: rows over every table file

  /// Bytes of one saved row: id, values, slots, and a hashed row's age.
  std::uint64_t record_bytes() const noexcept {
    return 8 + std::uint64_t(spec.dim) * sizeof(float) * (1 + num_slots) + (spec.hashed() ? 8 : 0);
  }
  /// Rows saved shard j holds: a fixed shard exactly these, a hashed shard at most.
  std::uint64_t shard_rows(std::uint64_t j) const noexcept {
    if (spec.hashed()) return spec.max_rows / num_shards + (spec.max_rows % num_shards != 0);
    return spec.rows / num_shards + (j < spec.rows % num_shards);
  }
  /// The saving run's routing of ids to shards (the ps it ran on do not matter here).
  embedding_layout layout() const {
    return spec.hashed() ? embedding_layout::hashed(spec, num_shards, 1)
                         : embedding_layout::fixed(spec, partitioners::fixed_size{num_shards}, 1);
  }
  /// The same table, as far as its rows are concerned (rows_saved aside).
  bool same_table(const checkpoint_table& o) const noexcept {
    return spec.name == o.spec.name && spec.rows == o.spec.rows && spec.dim == o.spec.dim &&
           spec.strategy == o.spec.strategy && spec.init.scale == o.spec.init.scale &&
           spec.init.seed == o.spec.init.seed && spec.max_rows == o.spec.max_rows &&
           spec.evict_after == o.spec.evict_after && num_shards == o.num_shards && rule == o.rule &&
           num_slots == o.num_slots;
  }
};

/// One table file (the rows of the table shards one ps held) and its checksum.
using checkpoint_table_file = checkpoint_file;

namespace detail::ckpt {

inline constexpr std::uint64_t max_table_dim = std::uint64_t(1) << 20;
inline constexpr std::uint64_t max_table_shards = std::uint64_t(1) << 20;
inline constexpr std::size_t max_table_name = 256;
inline constexpr char table_magic[8] = {'D', 'T', 'F', 'T', 'A', 'B', 'L', '1'};

/// One table's shards as a ps saves them: each shard's rows as records (table_file.hpp's
/// layout), ids increasing.
struct table_snapshot {
  checkpoint_table table;
  struct shard {
    std::uint32_t index = 0;
    std::int64_t iterations = 0;
    std::uint64_t rows = 0;
    std::vector<std::byte> records;  // rows * table.record_bytes()
  };
  std::vector<shard> shards;
};

inline std::string table_file_name(const std::string& name, std::size_t ps, std::size_t num_ps) {
  return name + ".tables-" + std::to_string(ps) + "-of-" + std::to_string(num_ps);
}

/// A table's spec, shard count and rule as JSON (the manifest adds rows_saved; a table file's
/// header its shards).
inline nlohmann::json table_to_json(const checkpoint_table& t) {
  const auto& s = t.spec;
  return {{"name", s.name},         {"rows", s.rows},
          {"dim", s.dim},           {"strategy", s.strategy == partition_strategy::mod ? "mod" : "div"},
          {"init_scale", s.init.scale}, {"init_seed", s.init.seed},
          {"max_rows", s.max_rows}, {"evict_after", s.evict_after},
          {"num_shards", t.num_shards}, {"rule", t.rule},
          {"num_slots", t.num_slots}};
}

/// Parses and checks table_to_json's fields of object `j` (at `path` of file `what`).
inline checkpoint_table parse_table(const nlohmann::json& j, const std::string& what, const std::string& path) {
  checkpoint_table t;
  auto& s = t.spec;
  s.name = string_at(j, "name", what, path, max_table_name);
  if (s.name.empty()) corrupt(what, join(path, "name"), "is empty");
  s.rows = u64_at(j, "rows", what, path);
  s.dim = std::uint32_t(u64_at_most(j, "dim", max_table_dim, what, path));
  if (s.dim == 0) corrupt(what, join(path, "dim"), "is 0");
  const auto strategy = string_at(j, "strategy", what, path, 16);
  if (strategy != "div" && strategy != "mod")
    corrupt(what, join(path, "strategy"), "'" + strategy + "' is not div or mod");
  s.strategy = strategy == "mod" ? partition_strategy::mod : partition_strategy::div;
  const auto& scale = field(j, "init_scale", what, path);
  if (!scale.is_number() || !std::isfinite(scale.get<double>()) ||
      std::fabs(scale.get<double>()) > double(std::numeric_limits<float>::max()))
    corrupt(what, join(path, "init_scale"), "is not a finite float");
  s.init.scale = scale.get<float>();
  s.init.seed = u64_at(j, "init_seed", what, path);
  s.max_rows = u64_at(j, "max_rows", what, path);
  s.evict_after = u64_at(j, "evict_after", what, path);
  t.num_shards = u64_at_most(j, "num_shards", max_table_shards, what, path);
  if (t.num_shards == 0 || (!s.hashed() && t.num_shards > s.rows))
    corrupt(what, join(path, "num_shards"), std::to_string(t.num_shards) + " shards for " +
                                                (s.hashed() ? "a hashed table" : std::to_string(s.rows) + " rows"));
  if (s.hashed() && s.max_rows == 0) corrupt(what, join(path, "max_rows"), "is 0 for a hashed table");
  t.rule = string_at(j, "rule", what, path, 64);
  const int slots = rule_slots(t.rule);
  if (slots < 0) corrupt(what, join(path, "rule"), "rule '" + t.rule + "' is not one of " + rule_names());
  t.num_slots = u64_at(j, "num_slots", what, path);
  if (t.num_slots != std::size_t(slots))
    corrupt(what, join(path, "num_slots"), std::to_string(t.num_slots) + " slots, rule " + t.rule + " has " +
                                               std::to_string(slots));
  std::uint64_t bytes = 0;
  if (!s.hashed() && !checked_mul(s.rows, t.record_bytes(), bytes))
    corrupt(what, join(path, "rows"), std::to_string(s.rows) + " rows of dim " + std::to_string(s.dim) +
                                          ": the byte count overflows");
  return t;
}

/// The manifest's "tables" and "table_files" (both or neither), checked: names unique and
/// confined (and no table file named like a shard file), one table file per ps at most, a fixed
/// table's rows saved all of it, and the rows saved fitting in the table files' bytes.
inline void parse_manifest_tables(const nlohmann::json& j, const std::string& what, std::size_t num_ps,
                                  const std::set<std::string>& taken_names, std::vector<checkpoint_table>& tables,
                                  std::vector<checkpoint_table_file>& files) {
  if (!j.is_object() || (!j.contains("tables") && !j.contains("table_files"))) return;
  const auto& ts = array_at(j, "tables", what, "");
  const auto& fs = array_at(j, "table_files", what, "");
  if (ts.empty() != fs.empty())
    corrupt(what, "table_files", std::to_string(fs.size()) + " table files for " + std::to_string(ts.size()) + " tables");
  std::set<std::string> names = taken_names;
  std::vector<bool> seen(num_ps, false);
  std::uint64_t file_bytes = 0;
  for (std::size_t i = 0; i < fs.size(); ++i) {
    files.push_back(parse_file_entry(fs[i], what, item("table_files", i), seen, names));
    if (!checked_add(file_bytes, files.back().bytes, file_bytes))
      corrupt(what, item("table_files", i) + ".bytes", "the byte counts overflow");
  }
  std::set<std::string> table_names;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto path = item("tables", i);
    auto t = parse_table(ts[i], what, path);
    if (!table_names.insert(t.spec.name).second)
      corrupt(what, path + ".name", "table '" + t.spec.name + "' is named twice");
    t.rows_saved = u64_at(ts[i], "rows_saved", what, path);
    // A hashed table holds at most its shards' capacity (max_rows rounded up to the shards).
    std::uint64_t most = t.spec.rows, held = 0;
    if (t.spec.hashed() && !checked_mul(t.shard_rows(0), t.num_shards, most)) most = ~std::uint64_t(0);
    if (t.spec.hashed() ? t.rows_saved > most : t.rows_saved != most)
      corrupt(what, path + ".rows_saved", std::to_string(t.rows_saved) + " rows of a table of " +
                                              (t.spec.hashed() ? "at most " : "") + std::to_string(most));
    if (!checked_mul(t.rows_saved, t.record_bytes(), held) || !checked_add(bytes, held, bytes) || bytes > file_bytes)
      corrupt(what, path + ".rows_saved", std::to_string(t.rows_saved) + " rows need more bytes than the table files' " +
                                              std::to_string(file_bytes));
    tables.push_back(std::move(t));
  }
}

inline void tables_to_json(nlohmann::json& j, const std::vector<checkpoint_table>& tables,
                           const std::vector<checkpoint_table_file>& files) {
  if (tables.empty() && files.empty()) return;  // the format of a checkpoint without tables
  j["tables"] = nlohmann::json::array();
  for (const auto& t : tables) {
    auto e = table_to_json(t);
    e["rows_saved"] = t.rows_saved;
    j["tables"].push_back(std::move(e));
  }
  j["table_files"] = nlohmann::json::array();
  for (const auto& f : files)
    j["table_files"].push_back({{"name", f.name}, {"ps", f.ps}, {"bytes", f.bytes}, {"sha256", f.sha256}});
}

}  // namespace detail::ckpt
}  // namespace dtf
