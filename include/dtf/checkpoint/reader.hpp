// dtf/checkpoint/reader.hpp — the one checkpoint reader: dtf-ckpt, restore and the free
// functions below all go through checkpoint_reader.
//
// checkpoint_reader::open(dir, name) reads and checks the manifest (dtf/checkpoint/format.hpp),
// opens every shard file and table file (regular files only, never through a symlink), checks
// its size and SHA-256 against the manifest, parses and checks its header, and maps every shard
// of the manifest to its place in exactly one file (table shards: dtf/checkpoint/table_file.hpp). Only then does read() hand out tensor bytes, one
// range at a time, straight from the files: nothing holds the whole checkpoint, so restore and
// dtf-ckpt stream (memory: the caller's buffers plus a 1 MiB hashing buffer).
//
// Between verification and read() a file could be rewritten by someone with write access to
// the directory; every read stays within the verified size (a shorter file is an error), so
// that can change values, never memory safety.
//
// Thread safety: a checkpoint_reader is read-only after open(); read() is safe from several
// threads (pread). Errors: errc::corrupt_data naming the file and field, errc::io_error (a file
// cannot be opened or read), errc::invalid_argument / shape_mismatch / out_of_range for a
// request the checkpoint cannot serve (a variable it lacks, another shape, a slot it lacks).
#pragma once

#include <dtf/checkpoint/format.hpp>
#include <dtf/checkpoint/input_file.hpp>
#include <dtf/checkpoint/shard_header.hpp>
#include <dtf/checkpoint/table_file.hpp>
#include <dtf/detail/sha256.hpp>
#include <dtf/variable.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf {

/// A verified checkpoint: the manifest and every shard file checked (see the file comment);
/// read() serves ranges of the saved flat layout straight from the files.
class checkpoint_reader {
 public:
  /// Opens and verifies checkpoint `name` of `dir`.
  static checkpoint_reader open(const std::filesystem::path& dir, const std::string& name);

  /// A range [first, first + count) of elements of the saved flat layout.
  struct element_range {
    /// The first element and the number of elements.
    ///@{
    std::uint64_t first = 0, count = 0;
    ///@}
  };
  /// Opens checkpoint `name` of `dir` for reading `ranges` only: the manifest is checked whole,
  /// but only the shard files holding part of a range are opened and verified (a ps restoring
  /// its own shards reads no other ps's file). read() outside them is an error.
  static checkpoint_reader open_for(const std::filesystem::path& dir, const std::string& name,
                                    std::span<const element_range> ranges);

  /// Opens checkpoint `name` of `dir` for its embedding tables only: the manifest is checked
  /// whole, the table files verified, no shard file opened (read() refuses every range).
  static checkpoint_reader open_tables(const std::filesystem::path& dir, const std::string& name);

  /// Verifies a checkpoint given as bytes: its manifest and, in the manifest's file order,
  /// every shard file and every table file (the fuzz target drives the reader through this).
  static checkpoint_reader from_memory(const std::string& manifest_json, std::vector<std::span<const std::byte>> shard_files,
                                       const std::string& what, std::vector<std::span<const std::byte>> table_files = {}) {
    auto m = checkpoint_manifest::from_json(detail::ckpt::parse_json(manifest_json, what), what);
    if (shard_files.size() != m.files.size() || table_files.size() != m.table_files.size())
      detail::ckpt::corrupt(what, "files", std::to_string(shard_files.size()) + " shard and " +
                                               std::to_string(table_files.size()) + " table files given");
    std::vector<detail::ckpt::input_file> files, tables;
    for (std::size_t i = 0; i < m.files.size(); ++i)
      files.push_back(detail::ckpt::input_file::memory(shard_files[i], m.files[i].name));
    for (std::size_t i = 0; i < m.table_files.size(); ++i)
      tables.push_back(detail::ckpt::input_file::memory(table_files[i], m.table_files[i].name));
    return checkpoint_reader(std::move(m), std::move(files), {}, std::move(tables));
  }

  /// The verified manifest.
  const checkpoint_manifest& manifest() const noexcept { return manifest_; }
  /// The verified table files, in the manifest's order (empty for a reader of open_for, which
  /// opens no table file). Their rows are read with table_file_reader::read.
  const std::vector<detail::ckpt::table_file_reader>& table_files() const noexcept { return table_files_; }
  /// Elements of the saved flat layout (bounded by the verified files' bytes).
  std::size_t num_parameters() const noexcept { return extent_; }

  /// Copies elements [begin, begin + out.size()) of the saved flat layout of tensor `tensor`
  /// (0: values, k: slot k-1) into out; elements no variable covers read as 0.
  void read(std::size_t tensor, std::size_t begin, std::span<float> out) const {
    if (tensor > manifest_.num_slots)
      throw error(errc::out_of_range, "checkpoint " + manifest_.name + " has " + std::to_string(manifest_.num_slots) +
                                          " slots, not slot " + std::to_string(int(tensor) - 1));
    if (begin > extent_ || out.size() > extent_ - begin)
      throw error(errc::out_of_range, "checkpoint " + manifest_.name + ": elements [" + std::to_string(begin) + ", +" +
                                          std::to_string(out.size()) + ") outside its " + std::to_string(extent_));
    std::fill(out.begin(), out.end(), 0.0f);
    const std::size_t end = begin + out.size();
    // The first shard ending after `begin` (shards_by_offset_ is sorted and disjoint).
    auto it = std::partition_point(shards_by_offset_.begin(), shards_by_offset_.end(), [&](std::size_t k) {
      return manifest_.shards[k].offset + manifest_.shards[k].size <= begin;
    });
    for (; it != shards_by_offset_.end() && manifest_.shards[*it].offset < end; ++it) {
      const auto& s = manifest_.shards[*it];
      const auto& at = places_[*it];
      if (!opened_[at.file])
        throw error(errc::invalid_argument, "checkpoint " + manifest_.name + ": " + manifest_.files[at.file].name +
                                                " was not opened by this reader (open_for another range)");
      const std::size_t from = std::max(begin, s.offset), to = std::min(end, s.offset + s.size);
      if (from >= to) continue;
      const std::uint64_t pos = at.data + (std::uint64_t(tensor) * s.size + (from - s.offset)) * sizeof(float);
      files_[at.file].read(pos, out.data() + (from - begin), (to - from) * sizeof(float));
    }
  }

  /// Values (slot < 0) or slot `slot` of variable `var_name` into out (its size).
  void read_variable(const std::string& var_name, int slot, std::span<float> out) const {
    const auto& v = variable(var_name);
    if (out.size() != v.size())
      throw error(errc::shape_mismatch, "checkpoint " + manifest_.name + ": '" + var_name + "' has " +
                                            std::to_string(v.size()) + " elements, not " + std::to_string(out.size()));
    read(std::size_t(slot + 1), v.offset, out);
  }

  /// The checkpoint's variable `var_name`. Errors: invalid_argument naming the ones it has.
  const checkpoint_variable& variable(const std::string& var_name) const {
    if (const auto* v = manifest_.find(var_name)) return *v;
    std::string known;
    for (const auto& x : manifest_.variables) known += (known.empty() ? "" : ", ") + x.name;
    throw error(errc::invalid_argument, "checkpoint " + manifest_.name + " has no variable '" + var_name +
                                            "' (it has: " + known + ")");
  }

  /// The checkpoint's variable matching a model's `v` by name and shape. Errors:
  /// invalid_argument (missing), shape_mismatch (another shape), naming the variable.
  const checkpoint_variable& match(const variable_spec& v) const { return match_variable(manifest_, v); }

  /// The same for a manifest alone.
  static const checkpoint_variable& match_variable(const checkpoint_manifest& m, const variable_spec& v) {
    const auto* sv = m.find(v.name);
    if (!sv) throw error(errc::invalid_argument, "checkpoint " + m.name + " has no variable '" + v.name + "'");
    if (sv->shape != v.shape)
      throw error(errc::shape_mismatch, "variable '" + v.name + "' is " + to_string(sv->shape) + " in checkpoint " +
                                            m.name + " but " + to_string(v.shape) + " in the model");
    return *sv;
  }

 private:
  struct place {
    std::size_t file = 0;
    std::uint64_t data = 0;  // byte offset of the shard's values in its file
  };

  // wanted[i]: files_[i] is opened (and verified here); empty: every file is.
  // tables: the table files, all of them (then verified here) or none.
  checkpoint_reader(checkpoint_manifest m, std::vector<detail::ckpt::input_file> files, std::vector<bool> wanted = {},
                    std::vector<detail::ckpt::input_file> tables = {})
      : manifest_(std::move(m)), files_(std::move(files)), extent_(manifest_.num_parameters()) {
    using namespace detail::ckpt;
    const auto& m_ = manifest_;
    for (std::size_t i = 0; i < tables.size(); ++i) table_files_.emplace_back(std::move(tables[i]), m_.table_files[i], m_);
    if (!tables.empty()) check_table_files(m_, table_files_);
    if (wanted.empty()) wanted.assign(files_.size(), true);
    opened_ = wanted;
    std::vector<std::size_t> file_of_ps(m_.num_ps);  // the manifest gives every ps one file
    for (std::size_t i = 0; i < m_.files.size(); ++i) file_of_ps[m_.files[i].ps] = i;
    std::unordered_map<std::uint32_t, std::size_t> by_id;
    for (std::size_t k = 0; k < m_.shards.size(); ++k) by_id[m_.shards[k].id] = k;
    std::vector<bool> found(m_.shards.size(), false);
    places_.assign(m_.shards.size(), place{});
    for (std::size_t i = 0; i < files_.size(); ++i) {
      if (!wanted[i]) continue;
      const auto& f = m_.files[i];
      const auto& in = files_[i];
      const auto text = verified_header_text(in, f);
      const auto h = parse_shard_header(text, in.size(), f.ps, m_.num_ps, m_.num_slots, in.what());
      check_shard_step(h, m_, in.what());  // every checkpoint, synchronous or not
      std::uint64_t at = h.data_offset;
      for (std::size_t e = 0; e < h.entries.size(); ++e) {
        const auto& entry = h.entries[e];
        const auto field = "header." + item("entries", e);
        const auto k = by_id.find(entry.id);
        if (k == by_id.end())
          corrupt(in.what(), field + ".shard", "shard " + std::to_string(entry.id) + " is not in the manifest");
        const auto& s = m_.shards[k->second];
        if (found[k->second] || s.size != entry.size || s.ps != f.ps)
          corrupt(in.what(), field, "shard " + std::to_string(entry.id) + " is duplicated or differs from the manifest");
        found[k->second] = true;
        places_[k->second] = {i, at};
        at += entry.size * sizeof(float) * (1 + m_.num_slots);  // bounded by parse_shard_header
      }
    }
    for (std::size_t k = 0; k < m_.shards.size(); ++k) {
      const auto file = file_of_ps[m_.shards[k].ps];
      if (!wanted[file]) {
        places_[k].file = file;  // read() refuses it
        continue;
      }
      if (!found[k])
        corrupt("checkpoint '" + m_.name + "'", item("shards", k),
                "shard " + std::to_string(m_.shards[k].id) + " is in no shard file");
    }
    // Empty shards hold nothing; the others are disjoint, so their ends rise with their offsets.
    for (std::size_t k = 0; k < m_.shards.size(); ++k)
      if (m_.shards[k].size != 0) shards_by_offset_.push_back(k);
    std::sort(shards_by_offset_.begin(), shards_by_offset_.end(),
              [&](auto a, auto b) { return m_.shards[a].offset < m_.shards[b].offset; });
  }

  checkpoint_manifest manifest_;
  std::vector<detail::ckpt::input_file> files_;
  std::vector<detail::ckpt::table_file_reader> table_files_;
  std::vector<bool> opened_;                  // per manifest file
  std::vector<place> places_;                 // per manifest shard
  std::vector<std::size_t> shards_by_offset_;  // manifest shard indices by flat offset
  std::size_t extent_ = 0;
};

/// Reads DIR/checkpoint; nullopt when there is none. Errors: errc::corrupt_data (malformed, or
/// naming a file outside the directory).
inline std::optional<checkpoint_state> read_checkpoint_state(const std::filesystem::path& dir) {
  const auto path = dir / checkpoint_state_name;
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return std::nullopt;
  const auto text = detail::ckpt::input_file::open(path).text(detail::ckpt::max_json_bytes);
  return checkpoint_state::from_json(detail::ckpt::parse_json(text, path.string()), path.string());
}

/// The name of the latest checkpoint in dir, or nullopt (TensorFlow's tf.train.latest_checkpoint).
inline std::optional<std::string> latest_checkpoint(const std::filesystem::path& dir) {
  auto s = read_checkpoint_state(dir);
  if (!s || s->latest.empty()) return std::nullopt;
  return s->latest;
}

/// Reads and checks NAME.manifest.json (no shard file is read).
inline checkpoint_manifest read_manifest(const std::filesystem::path& dir, const std::string& name) {
  detail::ckpt::require_confined(name, dir.string(), "checkpoint name");
  const auto path = dir / detail::ckpt::manifest_file_name(name);
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    throw error(errc::io_error, "checkpoint '" + name + "' has no manifest " + path.string());
  const auto text = detail::ckpt::input_file::open(path).text(detail::ckpt::max_json_bytes);
  auto m = checkpoint_manifest::from_json(detail::ckpt::parse_json(text, path.string()), path.string());
  if (m.name != name) detail::ckpt::corrupt(path.string(), "name", "'" + m.name + "', not '" + name + "'");
  return m;
}

inline checkpoint_reader checkpoint_reader::open(const std::filesystem::path& dir, const std::string& name) {
  auto m = read_manifest(dir, name);
  std::vector<detail::ckpt::input_file> files;
  std::vector<detail::ckpt::input_file> tables;
  for (const auto& f : m.files) files.push_back(detail::ckpt::input_file::open(dir / f.name));
  for (const auto& f : m.table_files) tables.push_back(detail::ckpt::input_file::open(dir / f.name));
  return checkpoint_reader(std::move(m), std::move(files), {}, std::move(tables));
}

inline checkpoint_reader checkpoint_reader::open_for(const std::filesystem::path& dir, const std::string& name,
                                                     std::span<const element_range> ranges) {
  auto m = read_manifest(dir, name);
  std::vector<bool> wanted(m.files.size(), false);
  for (const auto& s : m.shards)
    for (const auto& r : ranges)
      if (s.size != 0 && (s.offset >= r.first ? s.offset - r.first < r.count : r.first - s.offset < s.size))
        for (std::size_t i = 0; i < m.files.size(); ++i) wanted[i] = wanted[i] || m.files[i].ps == s.ps;
  std::vector<detail::ckpt::input_file> files(m.files.size());
  for (std::size_t i = 0; i < m.files.size(); ++i)
    if (wanted[i]) files[i] = detail::ckpt::input_file::open(dir / m.files[i].name);
  return checkpoint_reader(std::move(m), std::move(files), std::move(wanted));
}

inline checkpoint_reader checkpoint_reader::open_tables(const std::filesystem::path& dir, const std::string& name) {
  auto m = read_manifest(dir, name);
  std::vector<detail::ckpt::input_file> tables;
  for (const auto& f : m.table_files) tables.push_back(detail::ckpt::input_file::open(dir / f.name));
  std::vector<detail::ckpt::input_file> files(m.files.size());
  std::vector<bool> wanted(m.files.size(), false);
  return checkpoint_reader(std::move(m), std::move(files), std::move(wanted), std::move(tables));
}

/// The full contents of a checkpoint in its saved flat layout (manifest.variables' offsets).
struct checkpoint_tensors {
  /// The checkpoint's manifest.
  checkpoint_manifest manifest;
  /// The saved values, in the manifest's flat layout.
  std::vector<float> values;
  std::vector<std::vector<float>> slots;  ///< manifest.num_slots buffers like values

  /// Values (slot < 0) or slot `slot` of a variable.
  std::span<const float> variable(const std::string& var_name, int slot = -1) const {
    const auto* v = manifest.find(var_name);
    if (!v) throw error(errc::invalid_argument, "checkpoint " + manifest.name + " has no variable '" + var_name + "'");
    if (slot >= int(slots.size()))
      throw error(errc::out_of_range, "checkpoint " + manifest.name + " has " + std::to_string(slots.size()) +
                                          " slots, not slot " + std::to_string(slot));
    const auto& buf = slot < 0 ? values : slots[std::size_t(slot)];
    return std::span<const float>(buf).subspan(v->offset, v->size());
  }
};

/// Reads a whole checkpoint, verified (checkpoint_reader::open), into memory. The allocation is
/// bounded by the bytes its files hold. Prefer checkpoint_reader to stream large ones.
inline checkpoint_tensors read_checkpoint(const std::filesystem::path& dir, const std::string& name) {
  const auto r = checkpoint_reader::open(dir, name);
  checkpoint_tensors t;
  t.manifest = r.manifest();
  t.values.resize(r.num_parameters());
  r.read(0, 0, t.values);
  t.slots.assign(t.manifest.num_slots, std::vector<float>(r.num_parameters()));
  for (std::size_t k = 0; k < t.slots.size(); ++k) r.read(k + 1, 0, t.slots[k]);
  return t;
}

/// Verifies a checkpoint (every checksum, size, header, the layout and every table row's id);
/// returns its manifest.
inline checkpoint_manifest verify_checkpoint(const std::filesystem::path& dir, const std::string& name) {
  const auto r = checkpoint_reader::open(dir, name);
  detail::ckpt::check_table_rows(r.table_files());
  return r.manifest();
}

/// Embedding table `table` of a checkpoint whole (see checkpoint_table_rows), values (slot < 0)
/// or slot `slot`. Errors: invalid_argument naming the tables there are; out_of_range for a slot
/// the table lacks; the table files' errors.
inline checkpoint_table_rows read_checkpoint_table(const checkpoint_reader& r, const std::string& table, int slot = -1) {
  return detail::ckpt::read_table(r.manifest(), r.table_files(), table, slot);
}

/// Copies a checkpoint's values (slot < 0) or a slot into `out`, laid out as `vars` (the
/// restoring model's variables: matched by name, shapes must agree; a variable of vars that
/// the checkpoint lacks is an error). Errors name the variable.
inline void copy_into_layout(const checkpoint_tensors& t, const std::vector<variable_spec>& vars, std::span<float> out,
                             int slot = -1) {
  for (const auto& v : vars) {
    const auto* sv = t.manifest.find(v.name);
    if (!sv)
      throw error(errc::invalid_argument, "checkpoint " + t.manifest.name + " has no variable '" + v.name + "'");
    if (sv->shape != v.shape)
      throw error(errc::shape_mismatch, "variable '" + v.name + "' is " + to_string(sv->shape) + " in checkpoint " +
                                            t.manifest.name + " but " + to_string(v.shape) + " in the model");
    if (v.offset > out.size() || v.size() > out.size() - v.offset)
      throw error(errc::shape_mismatch, "copy_into_layout: buffer too small for variable '" + v.name + "'");
    const auto src = t.variable(v.name, slot);
    std::copy(src.begin(), src.end(), out.begin() + std::ptrdiff_t(v.offset));
  }
}

/// One kept checkpoint and whether it verifies.
struct checkpoint_verdict {
  /// The checkpoint's name.
  std::string name;
  bool latest = false;                          ///< the state file's "latest"
  std::optional<checkpoint_manifest> manifest;  ///< set when it verifies
  std::string error;                            ///< why it does not
  /// Whether it verifies (and can be restored).
  bool usable() const noexcept { return manifest.has_value(); }
};

/// Verifies every checkpoint the state file keeps (oldest first; the latest added when the
/// state file does not list it). Empty when there is no state file. Errors: only those of the
/// state file itself (a checkpoint that fails is reported in its verdict).
inline std::vector<checkpoint_verdict> verify_all_checkpoints(const std::filesystem::path& dir) {
  std::vector<checkpoint_verdict> out;
  const auto state = read_checkpoint_state(dir);
  if (!state) return out;
  auto names = state->all;
  if (!state->latest.empty() && std::find(names.begin(), names.end(), state->latest) == names.end())
    names.push_back(state->latest);
  for (const auto& n : names) {
    checkpoint_verdict v{.name = n, .latest = n == state->latest, .manifest = std::nullopt, .error = {}};
    try {
      v.manifest = verify_checkpoint(dir, n);
    } catch (const error& e) {
      v.error = e.what();
    }
    out.push_back(std::move(v));
  }
  return out;
}

/// Opens the checkpoint a restore should use: the latest when it verifies; otherwise, with
/// checkpoint_fallback::newest_valid, the newest kept one that verifies, telling `log` about
/// every one skipped and which is used. nullopt when the directory holds no checkpoint.
/// Errors: with refuse, the latest's error; when none verifies, errc::corrupt_data naming the
/// latest's cause; state-file errors as read_checkpoint_state.
inline std::optional<checkpoint_reader> open_latest_checkpoint(const std::filesystem::path& dir,
                                                              checkpoint_fallback fallback,
                                                              const std::function<void(const std::string&)>& log = {}) {
  const auto state = read_checkpoint_state(dir);
  if (!state || state->latest.empty()) return std::nullopt;
  std::vector<std::string> candidates{state->latest};
  for (auto it = state->all.rbegin(); it != state->all.rend(); ++it)
    if (std::find(candidates.begin(), candidates.end(), *it) == candidates.end()) candidates.push_back(*it);
  std::optional<error> first;
  for (const auto& n : candidates) {
    try {
      auto r = checkpoint_reader::open(dir, n);
      if (first && log) log("restoring " + n + ", the newest kept checkpoint of " + dir.string() + " that verifies");
      return r;
    } catch (const error& e) {
      const bool damaged = e.code() == make_error_code(errc::corrupt_data) || e.code() == make_error_code(errc::io_error);
      if (!damaged || fallback == checkpoint_fallback::refuse) throw;
      if (log) log("checkpoint " + n + " failed verification (" + e.what() + ")");
      if (!first) first = e;
    }
  }
  throw error(errc::corrupt_data, "no kept checkpoint in " + dir.string() + " verifies; the latest, " + state->latest +
                                      ": " + first->what());
}

/// The name of the newest kept checkpoint that verifies, or nullopt when none does.
inline std::optional<std::string> newest_usable_checkpoint(const std::filesystem::path& dir) {
  try {
    if (auto r = open_latest_checkpoint(dir, checkpoint_fallback::newest_valid)) return r->manifest().name;
  } catch (const error& e) {
    if (e.code() != make_error_code(errc::corrupt_data) && e.code() != make_error_code(errc::io_error)) throw;
  }
  return std::nullopt;
}

}  // namespace dtf
