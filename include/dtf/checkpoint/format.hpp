// dtf/checkpoint/format.hpp — what a checkpoint on disk is, and the checks every number and
// name read from one passes before it is used (DESIGN.md §7; the file layout is described in
// dtf/checkpoint.hpp).
//
// A checkpoint directory is input: it may be damaged, truncated, written by another version
// or crafted. Everything parsed here is checked against a closed set (format, dtype, update
// rule), for wrap-around (offsets + sizes, element counts of shapes, byte totals) and against
// the other fields (every shard inside its variable, the shards of a variable tiling it, the
// files' declared bytes holding the whole layout); names are confined to the checkpoint
// directory (no '/', no "..", no absolute path). Errors: dtf::error with errc::corrupt_data
// naming the file and the field ("…/ckpt-5.manifest.json: variables[1].offset: …").
//
// Thread safety: plain values and pure functions.
#pragma once

#include <dtf/checkpoint/fields.hpp>
#include <dtf/checkpoint/table_format.hpp>
#include <dtf/data/position.hpp>
#include <dtf/error.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/shape.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace dtf {

static_assert(std::endian::native == std::endian::little,
              "dtf checkpoints store float32 little-endian: a big-endian host would need byte swapping");

/// Name of the state file in a checkpoint directory.
inline constexpr const char* checkpoint_state_name = "checkpoint";

/// One variable in a checkpoint.
struct checkpoint_variable {
  /// The variable's name.
  std::string name;
  /// The variable's shape.
  dims shape;
  std::size_t offset = 0;       ///< first element in the saved flat buffer
  std::int64_t iterations = 0;  ///< updates its update rule had applied (Adam's t)
  /// The variable's number of elements.
  std::size_t size() const noexcept { return num_elements(shape); }
};

/// One shard in a checkpoint: rows [row_begin, row_end) of a variable, held by ps `ps`.
struct checkpoint_shard {
  std::uint32_t id = 0;  ///< shard id in the saving placement
  /// The variable (index into the manifest's variables) and its part, the ps that holds the
  /// shard, its rows [row_begin, row_end), and its elements' place in the saved buffer (offset,
  /// size).
  ///@{
  std::size_t variable = 0, part = 0, ps = 0, row_begin = 0, row_end = 0, offset = 0, size = 0;
  ///@}
};

/// What restore does when the latest checkpoint fails verification.
enum class checkpoint_fallback {
  newest_valid,  ///< says so and uses the newest kept checkpoint that verifies
  refuse,        ///< throws the latest's error
};

/// The manifest: everything about a checkpoint except the tensor bytes.
struct checkpoint_manifest {
  /// The checkpoint's name: its files are named after it, and the state file lists it.
  std::string name;
  /// The global step saved.
  std::int64_t global_step = 0;
  /// Saved by synchronous training: every shard file holds the state after global_step (its
  /// header's step; checked by the reader). Absent (false) in asynchronous and older ones.
  bool synchronous = false;
  /// The element type of the saved values.
  std::string dtype = "float32";
  /// The number of ps that saved it.
  std::size_t num_ps = 0;
  std::string rule = "sgd";  ///< update rule whose slots were saved
  /// The number of slot buffers of the update rule saved beside the values.
  std::size_t num_slots = 0;
  /// The variables saved, in the flat layout's order.
  std::vector<checkpoint_variable> variables;
  /// The shards of the saving placement.
  std::vector<checkpoint_shard> shards;
  /// The shard files and their checksums.
  std::vector<checkpoint_file> files;
  std::vector<checkpoint_table> tables;             ///< embedding tables (none in older checkpoints)
  std::vector<checkpoint_table_file> table_files;   ///< their files, one per ps that held a table
  /// The training tasks' data positions at the save (dtf/ps/positions.hpp; none in older
  /// checkpoints): where a restarted task resumes its shard.
  std::vector<data::task_position> positions;

  /// The table named `table_name`, or nullptr.
  const checkpoint_table* find_table(const std::string& table_name) const noexcept {
    for (const auto& t : tables)
      if (t.spec.name == table_name) return &t;
    return nullptr;
  }

  /// Elements of the saved flat buffer (for a manifest that passed from_json, this cannot wrap).
  std::size_t num_parameters() const noexcept {
    std::size_t n = 0;
    for (const auto& v : variables) n = std::max(n, v.offset + v.size());
    return n;
  }
  /// The variable named `name`, or nullptr.
  const checkpoint_variable* find(const std::string& var_name) const noexcept {
    for (const auto& v : variables)
      if (v.name == var_name) return &v;
    return nullptr;
  }

  /// The manifest as JSON (the manifest file's contents).
  nlohmann::json to_json() const {
    nlohmann::json j;
    j["format"] = detail::ckpt::manifest_format;
    j["name"] = name;
    j["global_step"] = global_step;
    if (synchronous) j["synchronous"] = true;  // the format of other checkpoints is unchanged
    j["dtype"] = dtype;
    j["num_ps"] = num_ps;
    j["rule"] = rule;
    j["num_slots"] = num_slots;
    j["variables"] = nlohmann::json::array();
    for (const auto& v : variables)
      j["variables"].push_back({{"name", v.name}, {"shape", v.shape}, {"offset", v.offset}, {"iterations", v.iterations}});
    j["shards"] = nlohmann::json::array();
    for (const auto& s : shards)
      j["shards"].push_back({{"id", s.id}, {"variable", s.variable}, {"part", s.part}, {"ps", s.ps},
                             {"row_begin", s.row_begin}, {"row_end", s.row_end}, {"offset", s.offset},
                             {"size", s.size}});
    j["files"] = nlohmann::json::array();
    for (const auto& f : files)
      j["files"].push_back({{"name", f.name}, {"ps", f.ps}, {"bytes", f.bytes}, {"sha256", f.sha256}});
    detail::ckpt::tables_to_json(j, tables, table_files);
    if (!positions.empty()) {  // the format of a checkpoint without positions is unchanged
      j["positions"] = nlohmann::json::array();
      for (const auto& p : positions)
        j["positions"].push_back({{"task", p.task},
                                  {"epoch", p.at.epoch},
                                  {"batch", p.at.batch},
                                  {"examples", p.at.examples},
                                  {"steps", p.at.steps},
                                  {"num_shards", p.at.num_shards},
                                  {"shard_size", p.at.shard_size},
                                  {"batch_size", p.at.batch_size},
                                  {"seed", p.at.seed}});
    }
    return j;
  }

  /// Parses a manifest and checks every field (see the file comment); `what` names its file
  /// in errors. A manifest that passes describes a layout its files' declared bytes hold.
  static checkpoint_manifest from_json(const nlohmann::json& j, const std::string& what) {
    using namespace detail::ckpt;
    checkpoint_manifest m;
    const auto format = string_at(j, "format", what, "");
    if (format != manifest_format) corrupt(what, "format", "unknown format '" + format.substr(0, 64) + "'");
    m.name = string_at(j, "name", what, "");
    require_confined(m.name, what, "name");
    m.global_step = count_at(j, "global_step", what, "");
    if (j.contains("synchronous")) {
      if (!j["synchronous"].is_boolean()) corrupt(what, "synchronous", "not a boolean");
      m.synchronous = j["synchronous"].get<bool>();
    }
    m.dtype = string_at(j, "dtype", what, "", 64);
    if (m.dtype != "float32") corrupt(what, "dtype", "dtype '" + m.dtype + "' (only float32 is supported)");
    m.rule = string_at(j, "rule", what, "", 64);
    const int slots = rule_slots(m.rule);
    if (slots < 0) corrupt(what, "rule", "rule '" + m.rule + "' is not one of " + rule_names());
    m.num_slots = u64_at(j, "num_slots", what, "");
    if (m.num_slots != std::size_t(slots))
      corrupt(what, "num_slots", std::to_string(m.num_slots) + " slots, rule " + m.rule + " has " +
                                     std::to_string(slots));
    m.num_ps = u64_at(j, "num_ps", what, "");
    if (m.num_ps == 0 || m.num_ps > max_num_ps)
      corrupt(what, "num_ps", std::to_string(m.num_ps) + " is not in [1, " + std::to_string(max_num_ps) + "]");
    m.parse_files(j, what);
    m.parse_variables(j, what);
    m.parse_shards(j, what);
    std::set<std::string> shard_files;
    for (const auto& f : m.files) shard_files.insert(f.name);
    parse_manifest_tables(j, what, m.num_ps, shard_files, m.tables, m.table_files);
    m.parse_positions(j, what);
    return m;
  }

 private:
  // Optional: task names unique, non-empty, at most 256 bytes; every number a u64.
  void parse_positions(const nlohmann::json& j, const std::string& what) {
    using namespace detail::ckpt;
    if (!j.contains("positions")) return;
    const auto& ps = array_at(j, "positions", what, "");
    std::set<std::string> tasks;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const auto path = item("positions", i);
      data::task_position p;
      p.task = string_at(ps[i], "task", what, path, 256);
      if (p.task.empty() || !tasks.insert(p.task).second)
        corrupt(what, path + ".task", "'" + p.task + "' is empty or named twice");
      p.at.epoch = u64_at(ps[i], "epoch", what, path);
      p.at.batch = u64_at(ps[i], "batch", what, path);
      p.at.examples = u64_at(ps[i], "examples", what, path);
      p.at.steps = u64_at(ps[i], "steps", what, path);
      p.at.num_shards = u64_at(ps[i], "num_shards", what, path);
      p.at.shard_size = u64_at(ps[i], "shard_size", what, path);
      p.at.batch_size = u64_at(ps[i], "batch_size", what, path);
      p.at.seed = u64_at(ps[i], "seed", what, path);
      positions.push_back(std::move(p));
    }
  }

  void parse_files(const nlohmann::json& j, const std::string& what) {
    using namespace detail::ckpt;
    const auto& fs = array_at(j, "files", what, "");
    if (fs.size() != num_ps)
      corrupt(what, "files", std::to_string(fs.size()) + " shard files for " + std::to_string(num_ps) + " ps");
    std::vector<bool> seen(num_ps, false);
    std::set<std::string> names;
    for (std::size_t i = 0; i < fs.size(); ++i) files.push_back(parse_file_entry(fs[i], what, item("files", i), seen, names));
  }

  void parse_variables(const nlohmann::json& j, const std::string& what) {
    using namespace detail::ckpt;
    const auto& vs = array_at(j, "variables", what, "");
    std::set<std::string> names;
    std::uint64_t file_bytes = 0;
    for (const auto& f : files)
      if (!checked_add(file_bytes, f.bytes, file_bytes)) corrupt(what, "files", "the byte counts overflow");
    const std::uint64_t tensor_bytes = sizeof(float) * (1 + num_slots);
    for (std::size_t i = 0; i < vs.size(); ++i) {
      const auto path = item("variables", i);
      checkpoint_variable v;
      v.name = string_at(vs[i], "name", what, path);
      if (v.name.empty() || !names.insert(v.name).second)
        corrupt(what, path + ".name", "'" + v.name + "' is empty or named twice");
      const auto& shape = array_at(vs[i], "shape", what, path);
      if (shape.size() > max_rank) corrupt(what, path + ".shape", "rank " + std::to_string(shape.size()) + " > 32");
      std::uint64_t elements = 1, bytes = 0, end = 0;
      for (std::size_t d = 0; d < shape.size(); ++d) {
        v.shape.push_back(as_u64(shape[d], what, path + ".shape" + "[" + std::to_string(d) + "]"));
        if (!checked_mul(elements, v.shape.back(), elements))
          corrupt(what, path + ".shape", to_string(v.shape) + ": the element count overflows size_t");
      }
      if (!checked_mul(elements, tensor_bytes, bytes))
        corrupt(what, path + ".shape", to_string(v.shape) + ": the byte count overflows size_t");
      v.offset = u64_at(vs[i], "offset", what, path);
      if (!checked_add(v.offset, elements, end) || !checked_mul(end, tensor_bytes, bytes))
        corrupt(what, path + ".offset", std::to_string(v.offset) + " + " + std::to_string(elements) +
                                            " elements wraps around");
      // The whole layout (values and slots) must fit in what the files declare (and, once
      // opened, hold): no reader allocates for a layout that no file backs.
      if (bytes > file_bytes)
        corrupt(what, path + ".offset", "the layout up to element " + std::to_string(end) + " needs " +
                                            std::to_string(bytes) + " bytes, more than the files' total of " +
                                            std::to_string(file_bytes));
      v.iterations = count_at(vs[i], "iterations", what, path);
      variables.push_back(std::move(v));
    }
    // Variables never overlap in the flat buffer.
    std::vector<std::size_t> order(variables.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return variables[a].offset < variables[b].offset; });
    std::size_t reach = 0, widest = 0;  // the furthest end so far, and whose
    for (auto k : order) {
      const auto& v = variables[k];
      if (v.size() == 0) continue;
      if (v.offset < reach) corrupt(what, item("variables", k) + ".offset", "overlaps variable '" + variables[widest].name + "'");
      reach = v.offset + v.size();
      widest = k;
    }
  }

  void parse_shards(const nlohmann::json& j, const std::string& what) {
    using namespace detail::ckpt;
    const auto& ss = array_at(j, "shards", what, "");
    std::set<std::uint32_t> ids;
    for (std::size_t i = 0; i < ss.size(); ++i) {
      const auto path = item("shards", i);
      checkpoint_shard s;
      s.id = std::uint32_t(u64_at_most(ss[i], "id", std::numeric_limits<std::uint32_t>::max(), what, path));
      if (!ids.insert(s.id).second) corrupt(what, path + ".id", "shard id " + std::to_string(s.id) + " appears twice");
      s.variable = u64_at(ss[i], "variable", what, path);
      if (s.variable >= variables.size())
        corrupt(what, path + ".variable", std::to_string(s.variable) + " of " + std::to_string(variables.size()) +
                                              " variables");
      s.part = u64_at(ss[i], "part", what, path);
      s.ps = u64_at(ss[i], "ps", what, path);
      if (s.ps >= num_ps) corrupt(what, path + ".ps", "ps " + std::to_string(s.ps) + " of " + std::to_string(num_ps));
      s.row_begin = u64_at(ss[i], "row_begin", what, path);
      s.row_end = u64_at(ss[i], "row_end", what, path);
      s.offset = u64_at(ss[i], "offset", what, path);
      s.size = u64_at(ss[i], "size", what, path);
      // Rows of its variable: a rank-0 variable is one row of one element. Every product is
      // bounded by the variable's size, which did not overflow.
      const auto& v = variables[s.variable];
      const std::size_t rows = v.shape.empty() ? 1 : v.shape[0];
      const std::size_t row_elements = v.shape.empty() ? 1 : num_elements(dims(v.shape.begin() + 1, v.shape.end()));
      if (s.row_begin > s.row_end || s.row_end > rows)
        corrupt(what, path + ".row_end", "rows [" + std::to_string(s.row_begin) + ", " + std::to_string(s.row_end) +
                                             ") of a variable of " + std::to_string(rows));
      if (rows != 0 && row_elements != 0 &&
          (s.size != (s.row_end - s.row_begin) * row_elements || s.offset != v.offset + s.row_begin * row_elements))
        corrupt(what, path + ".offset", "offset " + std::to_string(s.offset) + " and size " + std::to_string(s.size) +
                                            " are not rows [" + std::to_string(s.row_begin) + ", " +
                                            std::to_string(s.row_end) + ") of variable '" + v.name + "'");
      if (s.offset < v.offset || s.size > v.size() || s.offset - v.offset > v.size() - s.size)
        corrupt(what, path + ".offset", "shard " + std::to_string(s.id) + " lies outside variable '" + v.name + "'");
      shards.push_back(s);
    }
    // The shards of each variable tile it exactly: no gap, no overlap.
    std::vector<std::size_t> order(shards.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](auto a, auto b) {
      return std::pair(shards[a].variable, shards[a].offset) < std::pair(shards[b].variable, shards[b].offset);
    });
    std::vector<std::size_t> cursor(variables.size());
    for (std::size_t v = 0; v < variables.size(); ++v) cursor[v] = variables[v].offset;
    for (auto k : order) {
      const auto& s = shards[k];
      if (s.offset != cursor[s.variable])
        corrupt(what, item("shards", k) + ".offset", "shard " + std::to_string(s.id) + " of '" +
                                                         variables[s.variable].name + "' overlaps another or leaves a gap");
      cursor[s.variable] += s.size;
    }
    for (std::size_t v = 0; v < variables.size(); ++v)
      if (cursor[v] != variables[v].offset + variables[v].size())
        corrupt(what, item("variables", v), "its shards cover " + std::to_string(cursor[v] - variables[v].offset) +
                                                " of " + std::to_string(variables[v].size()) + " elements");
  }
};

/// The state file: the latest checkpoint and every kept one (oldest first).
struct checkpoint_state {
  /// The latest checkpoint's name.
  std::string latest;
  /// Every kept checkpoint's name, oldest first.
  std::vector<std::string> all;

  /// Parses and checks a state file (every name confined to the directory; "latest" may be
  /// empty: no checkpoint yet); `what` names its file in errors.
  static checkpoint_state from_json(const nlohmann::json& j, const std::string& what) {
    using namespace detail::ckpt;
    checkpoint_state s;
    s.latest = string_at(j, "latest", what, "", max_name_bytes + 1);
    if (!s.latest.empty()) require_confined(s.latest, what, "latest");
    const auto& all = array_at(j, "all", what, "");
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (!all[i].is_string()) corrupt(what, item("all", i), "is not a string");
      s.all.push_back(all[i].get<std::string>());
      require_confined(s.all.back(), what, item("all", i));
    }
    return s;
  }
};

}  // namespace dtf
