// dtf/checkpoint/table_file.hpp — reading a table file: the rows of the embedding-table shards
// one ps held at a save (written by detail::ckpt::write_table_file, dtf/checkpoint/writer.hpp).
//
// File NAME.tables-I-of-N (little-endian):
//   0   8  magic "DTFTABL1"
//   8   8  header length H
//   16  H  header (JSON): {"format":1,"ps":I,"num_ps":N,"tables":[{TABLE..., "shards":
//          [{"shard":j,"iterations":t,"rows":n}, ...]}, ...]}, TABLE the spec, shard count and
//          rule as in the manifest (dtf/checkpoint/table_format.hpp)
//   ... for each table, each of its shards in header order, n records of
//          id (uint64) | values (dim float32) | each slot (dim float32) | hashed: age (uint64)
// Ids rise strictly within a shard and each routes to its shard under the saved layout; a fixed
// shard holds every one of its rows, a hashed shard its live rows. age: the pushes its shard
// applied since the row was last touched (the eviction clock), so eviction resumes where it was.
//
// table_file_reader checks the file against the manifest (size, SHA-256), its header (every field,
// each table the manifest's, the row counts and bytes exactly the file's) and, as rows are read,
// every id; check_table_files checks that the files together hold every shard of every table
// once. Reads are bounded by the verified size and a caller's chunk: nothing allocates by what
// a file says beyond the rows asked for.
//
// Thread safety: read() is const and safe from several threads. Errors: errc::corrupt_data
// naming the file and the field, errc::io_error.
#pragma once

#include <dtf/checkpoint/format.hpp>
#include <dtf/checkpoint/input_file.hpp>
#include <dtf/checkpoint/shard_header.hpp>
#include <dtf/checkpoint/table_format.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtf {

namespace detail::ckpt {

/// A table file's parsed header.
struct table_header {
  struct shard {
    std::uint32_t index = 0;
    std::int64_t iterations = 0;
    std::uint64_t rows = 0, offset = 0;  // offset: the byte of its first record
  };
  struct table {
    checkpoint_table table;
    std::vector<shard> shards;
  };
  std::vector<table> tables;
};

/// Parses a table file's JSON header `text` (of a file of file_bytes bytes, for ps `ps` of
/// num_ps) and checks that its shards' rows, without wrap-around, are exactly the bytes after it.
inline table_header parse_table_header(std::string_view text, std::uint64_t file_bytes, std::size_t ps,
                                       std::size_t num_ps, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    corrupt(what, "header", std::string("malformed JSON: ") + e.what());
  }
  if (u64_at(j, "format", what, "header") != 1) corrupt(what, "header.format", "unknown table file format");
  if (u64_at(j, "ps", what, "header") != ps) corrupt(what, "header.ps", "another ps than the manifest's " + std::to_string(ps));
  if (u64_at(j, "num_ps", what, "header") != num_ps)
    corrupt(what, "header.num_ps", "differs from the manifest's " + std::to_string(num_ps));
  const auto& ts = array_at(j, "tables", what, "header");
  table_header h;
  std::uint64_t at = shard_prefix_bytes + text.size();
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto path = "header." + item("tables", i);
    table_header::table t{parse_table(ts[i], what, path), {}};
    const auto& ss = array_at(ts[i], "shards", what, path);
    std::vector<bool> seen;
    for (std::size_t k = 0; k < ss.size(); ++k) {
      const auto sp = path + "." + item("shards", k);
      table_header::shard s;
      s.index = std::uint32_t(u64_at_most(ss[k], "shard", t.table.num_shards - 1, what, sp));
      if (seen.size() <= s.index) seen.resize(std::size_t(s.index) + 1);
      if (seen[s.index]) corrupt(what, sp + ".shard", "shard " + std::to_string(s.index) + " appears twice");
      seen[s.index] = true;
      s.iterations = count_at(ss[k], "iterations", what, sp);
      s.rows = u64_at(ss[k], "rows", what, sp);
      const std::uint64_t most = t.table.shard_rows(s.index);
      if (t.table.spec.hashed() ? s.rows > most : s.rows != most)
        corrupt(what, sp + ".rows", std::to_string(s.rows) + " rows in a shard of " +
                                        (t.table.spec.hashed() ? "at most " : "") + std::to_string(most));
      std::uint64_t bytes = 0;
      s.offset = at;
      if (!checked_mul(s.rows, t.table.record_bytes(), bytes) || !checked_add(at, bytes, at) || at > file_bytes)
        corrupt(what, sp + ".rows", std::to_string(s.rows) + " rows exceed the file's " + std::to_string(file_bytes) +
                                        " bytes");
      t.shards.push_back(s);
    }
    h.tables.push_back(std::move(t));
  }
  if (at != file_bytes)
    corrupt(what, "header.tables", std::to_string(file_bytes) + " bytes, the header describes " + std::to_string(at));
  return h;
}

/// Rows of one saved shard, as the wire carries them: ids, then every row's values, then every
/// row's slot 0, slot 1 (rows * dim floats each), then a hashed table's ages.
struct table_rows {
  std::vector<std::uint64_t> ids;
  std::vector<float> tensors;
  std::vector<std::uint64_t> ages;
  std::size_t size() const noexcept { return ids.size(); }
};

/// Rows of `t` per read that keep a chunk near 4 MiB (at least one row).
inline std::uint64_t chunk_rows(const checkpoint_table& t) noexcept {
  return std::max<std::uint64_t>(1, (std::uint64_t(1) << 22) / t.record_bytes());
}

/// A verified table file (see the file comment).
class table_file_reader {
 public:
  /// Checks `in` against the manifest's record `f` and tables; reads no row yet.
  table_file_reader(input_file in, const checkpoint_table_file& f, const checkpoint_manifest& m) : in_(std::move(in)) {
    header_ = parse_table_header(verified_header_text(in_, f, table_magic, "table"), in_.size(), f.ps, m.num_ps,
                                 in_.what());
    for (std::size_t i = 0; i < header_.tables.size(); ++i) {
      const auto& t = header_.tables[i].table;
      const auto* saved = m.find_table(t.spec.name);
      if (!saved || !saved->same_table(t))
        corrupt(in_.what(), "header." + item("tables", i), "table '" + t.spec.name + "' is not the manifest's");
      layouts_.push_back(t.layout());
    }
  }

  const table_header& header() const noexcept { return header_; }
  const std::string& what() const noexcept { return in_.what(); }

  /// Where a read of shard `shard` of table `table` (header indices) stands.
  struct cursor {
    std::size_t table = 0, shard = 0;
    std::uint64_t next = 0;              // rows read
    std::optional<std::uint64_t> last;   // the last id read
  };

  /// Reads the next rows (at most max_rows, at least 1) of the cursor's shard into out; false
  /// when none is left. Every id is checked: routed to this shard, rising.
  bool read(cursor& c, std::uint64_t max_rows, table_rows& out) const {
    const auto& t = header_.tables.at(c.table);
    const auto& s = t.shards.at(c.shard);
    const auto& table = t.table;
    const std::uint64_t n = std::min(std::max<std::uint64_t>(max_rows, 1), s.rows - c.next);
    out.ids.resize(std::size_t(n));
    out.ages.resize(table.spec.hashed() ? std::size_t(n) : 0);
    const std::size_t dim = table.spec.dim, tensors = 1 + table.num_slots;
    out.tensors.resize(std::size_t(n) * dim * tensors);
    if (n == 0) return false;
    const std::uint64_t rb = table.record_bytes();
    std::vector<std::byte> buf(std::size_t(n * rb));  // n * rb lies inside the verified file
    in_.read(s.offset + c.next * rb, buf.data(), buf.size());
    const auto& layout = layouts_[c.table];
    for (std::size_t r = 0; r < n; ++r) {
      const std::byte* rec = buf.data() + r * rb;
      std::uint64_t id = 0;
      std::memcpy(&id, rec, 8);
      const bool routed = table.spec.hashed() ? embedding_layout::mix(id) % table.num_shards == s.index
                                              : id < table.spec.rows && layout.place(id).shard == s.index;
      if (!routed || (c.last && id <= *c.last))
        corrupt(in_.what(), "table '" + table.spec.name + "' shard " + std::to_string(s.index) + " row " +
                                std::to_string(c.next + r),
                "id " + std::to_string(id) + (routed ? " does not rise" : " is not of this shard"));
      c.last = id;
      out.ids[r] = id;
      for (std::size_t k = 0; k < tensors; ++k)
        std::memcpy(out.tensors.data() + (k * n + r) * dim, rec + 8 + k * dim * sizeof(float), dim * sizeof(float));
      if (table.spec.hashed()) std::memcpy(&out.ages[r], rec + 8 + tensors * dim * sizeof(float), 8);
    }
    c.next += n;
    return true;
  }

 private:
  input_file in_;
  table_header header_;
  std::vector<embedding_layout> layouts_;
};

/// Checks that the table files together hold every shard of every table of the manifest exactly
/// once, and the manifest's row counts.
inline void check_table_files(const checkpoint_manifest& m, const std::vector<table_file_reader>& files) {
  for (std::size_t i = 0; i < m.tables.size(); ++i) {
    const auto& t = m.tables[i];
    std::vector<bool> seen(std::size_t(t.num_shards), false);
    std::uint64_t rows = 0;
    for (const auto& f : files)
      for (const auto& ft : f.header().tables) {
        if (ft.table.spec.name != t.spec.name) continue;
        for (const auto& s : ft.shards) {
          if (seen[s.index])
            corrupt(f.what(), "table '" + t.spec.name + "'", "shard " + std::to_string(s.index) + " is in two files");
          seen[s.index] = true;
          rows += s.rows;  // bounded by the files' bytes (a row is at least 16 of them)
        }
      }
    const auto missing = std::find(seen.begin(), seen.end(), false);
    if (missing != seen.end())
      corrupt("checkpoint '" + m.name + "'", item("tables", i),
              "shard " + std::to_string(missing - seen.begin()) + " of table '" + t.spec.name + "' is in no table file");
    if (rows != t.rows_saved)
      corrupt("checkpoint '" + m.name + "'", item("tables", i) + ".rows_saved",
              std::to_string(t.rows_saved) + ", the table files hold " + std::to_string(rows));
  }
}

/// Reads every row of every table file, checking every id (what opening leaves to the reads of
/// rows), a chunk at a time.
inline void check_table_rows(const std::vector<table_file_reader>& files) {
  table_rows rows;
  for (const auto& f : files)
    for (std::size_t t = 0; t < f.header().tables.size(); ++t)
      for (std::size_t s = 0; s < f.header().tables[t].shards.size(); ++s)
        for (table_file_reader::cursor c{t, s, 0, {}}; f.read(c, chunk_rows(f.header().tables[t].table), rows);) {
        }
}

}  // namespace detail::ckpt

/// One embedding table of a checkpoint whole: its saved ids, rising, and their rows (row i of
/// dim floats for ids[i]). Memory: the table's saved bytes (bounded by its verified files).
struct checkpoint_table_rows {
  /// Floats per row.
  std::uint32_t dim = 0;
  /// The saved ids, rising.
  std::vector<std::uint64_t> ids;
  /// Row i (dim floats) for ids[i], row after row.
  std::vector<float> rows;
};

namespace detail::ckpt {

inline checkpoint_table_rows read_table(const checkpoint_manifest& m, const std::vector<table_file_reader>& files,
                                        const std::string& name, int slot) {
  const auto* t = m.find_table(name);
  if (!t) {
    std::string known;
    for (const auto& x : m.tables) known += (known.empty() ? "" : ", ") + x.spec.name;
    throw error(errc::invalid_argument, "checkpoint " + m.name + " has no embedding table '" + name +
                                            "' (it has: " + (known.empty() ? "none" : known) + ")");
  }
  if (slot >= int(t->num_slots))
    throw error(errc::out_of_range, "embedding '" + name + "' of checkpoint " + m.name + " has " +
                                        std::to_string(t->num_slots) + " slots, not slot " + std::to_string(slot));
  const std::size_t dim = t->spec.dim, k = std::size_t(slot + 1);
  checkpoint_table_rows out{t->spec.dim, {}, {}};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> order;  // (id, row in out)
  table_rows rows;
  for (const auto& f : files)
    for (std::size_t i = 0; i < f.header().tables.size(); ++i) {
      if (f.header().tables[i].table.spec.name != name) continue;
      for (std::size_t s = 0; s < f.header().tables[i].shards.size(); ++s)
        for (table_file_reader::cursor c{i, s, 0, {}}; f.read(c, chunk_rows(*t), rows);)
          for (std::size_t r = 0; r < rows.size(); ++r) {
            order.emplace_back(rows.ids[r], order.size());
            out.rows.insert(out.rows.end(), rows.tensors.begin() + std::ptrdiff_t((k * rows.size() + r) * dim),
                            rows.tensors.begin() + std::ptrdiff_t((k * rows.size() + r + 1) * dim));
          }
    }
  // Shards hold disjoint ids (each routed to its shard when read): sorting gives them rising.
  std::sort(order.begin(), order.end());
  std::vector<float> sorted(out.rows.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    out.ids.push_back(order[i].first);
    std::copy_n(out.rows.begin() + std::ptrdiff_t(order[i].second * dim), dim, sorted.begin() + std::ptrdiff_t(i * dim));
  }
  out.rows = std::move(sorted);
  return out;
}

}  // namespace detail::ckpt
}  // namespace dtf
