// dtf/checkpoint/writer.hpp — writing checkpoint files crash-safely and without trusting the
// directory's contents: each file through detail::ckpt::atomic_file (a fresh temporary name,
// never through a symlink, synced and renamed into place: dtf/checkpoint/atomic_file.hpp).
// Names written are checked to be plain file names inside the directory.
//
// Thread safety: free functions; saving into one directory is the chief's job (one writer of
// the manifest and state file). Errors: errc::io_error (a file cannot be created, written,
// renamed), errc::invalid_argument (a name or state that cannot be written).
#pragma once

#include <dtf/checkpoint/atomic_file.hpp>
#include <dtf/checkpoint/format.hpp>
#include <dtf/checkpoint/reader.hpp>
#include <dtf/error.hpp>
#include <dtf/variable.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace dtf {

/// Where and how the chief saves checkpoints.
struct checkpoint_options {
  std::string directory;          ///< shared by the chief and every ps (a shared file system across hosts)
  std::string prefix = "ckpt";    ///< checkpoints are named "<prefix>-<global step>"
  std::size_t max_to_keep = 5;    ///< older ones are deleted; 0 keeps all
};

namespace detail::ckpt {

/// One shard as a ps saves it: its values and slots (pointers to them or to their copies).
struct shard_record {
  std::uint32_t id = 0;
  std::uint64_t size = 0;
  std::int64_t iterations = 0;
  std::vector<const float*> tensors;  ///< values, then num_slots slots
};

// Checks that `name` names ps `ps`'s shard file inside `dir` (`who` names the caller in the
// error) and creates `dir`; returns the file's record, its bytes and SHA-256 still to fill.
inline checkpoint_file shard_file_of(const std::filesystem::path& dir, const std::string& name, std::size_t ps,
                                     std::size_t num_ps, const char* who) {
  if (!confined_name(manifest_file_name(name)) || ps >= num_ps)
    throw error(errc::invalid_argument, std::string(who) + ": '" + name.substr(0, 64) + "' (ps " + std::to_string(ps) +
                                            " of " + std::to_string(num_ps) + ") names no file inside " + dir.string());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw error(errc::io_error, "cannot create checkpoint directory " + dir.string() + ": " + ec.message());
  checkpoint_file f;
  f.name = shard_file_name(name, ps, num_ps);
  f.ps = ps;
  return f;
}

// A shard file's JSON header (layout in dtf/checkpoint.hpp). `synchronous`: written while the
// job's steps were held, so the file is of the checkpoint's step (the reader checks it).
inline std::string shard_header_text(std::size_t ps, std::size_t num_ps, std::int64_t global_step,
                                     std::size_t num_slots, const std::vector<shard_record>& records,
                                     bool synchronous = false) {
  nlohmann::json header{{"format", 1}, {"ps", ps}, {"num_ps", num_ps}, {"global_step", global_step},
                        {"num_slots", num_slots}, {"entries", nlohmann::json::array()}};
  if (synchronous) header["synchronous"] = true;  // the format of other files is unchanged
  for (const auto& r : records)
    header["entries"].push_back({{"shard", r.id}, {"size", r.size}, {"iterations", r.iterations}});
  return header.dump();
}

/// Writes one ps's shard file of checkpoint `name` (crash-safely). Returns its file record.
/// Errors: invalid_argument when `name` is not a plain file name; io_error.
inline checkpoint_file write_shard_file(const std::filesystem::path& dir, const std::string& name, std::size_t ps,
                                        std::size_t num_ps, std::int64_t global_step, std::size_t num_slots,
                                        const std::vector<shard_record>& records, const checkpoint_fault& fault = {}) {
  auto f = shard_file_of(dir, name, ps, num_ps, "write_shard_file");
  const std::string text = shard_header_text(ps, num_ps, global_step, num_slots, records);
  std::uint64_t len = text.size();
  std::vector<piece> pieces{{shard_magic, sizeof shard_magic}, {&len, sizeof len}, {text.data(), text.size()}};
  for (const auto& r : records) {
    DTF_ASSERT(r.tensors.size() == 1 + num_slots, "a shard record carries its values and every slot");
    for (const float* t : r.tensors) pieces.push_back({t, r.size * sizeof(float)});
  }
  const auto w = write_atomically(dir / f.name, pieces, fault);
  f.bytes = w.bytes;
  f.sha256 = w.sha256;
  return f;
}

/// The same file, written without holding every shard: `records` give each shard's id and size,
/// and copy(r), called for each in the file's order just before its bytes are written, sets
/// r.iterations and r.tensors (valid until the next call). Memory: what `copy` holds. The header
/// comes first in the file but its iterations are known only as the shards are copied: its
/// length is reserved with every count at its widest (INT64_MIN's 20 characters), and the real
/// header is written over the reservation at the end, padded with spaces (JSON whitespace, which
/// the reader's parse of the declared length accepts); the SHA-256 is then computed by reading
/// the file back, before it is synced and renamed.
inline checkpoint_file stream_shard_file(const std::filesystem::path& dir, const std::string& name, std::size_t ps,
                                         std::size_t num_ps, std::int64_t global_step, std::size_t num_slots,
                                         std::vector<shard_record> records,
                                         const std::function<void(shard_record&)>& copy,
                                         const checkpoint_fault& fault = {}, bool synchronous = false) {
  auto f = shard_file_of(dir, name, ps, num_ps, "stream_shard_file");
  for (auto& r : records) r.iterations = std::numeric_limits<std::int64_t>::min();
  const std::uint64_t len = shard_header_text(ps, num_ps, global_step, num_slots, records, synchronous).size();
  atomic_file out(dir / f.name, fault, true);
  out.append(shard_magic, sizeof shard_magic);
  out.append(&len, sizeof len);
  out.append(std::string(len, ' ').data(), len);
  for (auto& r : records) {
    copy(r);
    DTF_ASSERT(r.tensors.size() == 1 + num_slots, "a shard record carries its values and every slot");
    for (const float* t : r.tensors) out.append(t, r.size * sizeof(float));
  }
  std::string text = shard_header_text(ps, num_ps, global_step, num_slots, records, synchronous);
  DTF_ASSERT(text.size() <= len, "a shard file's header fits the length reserved for it");
  text.resize(len, ' ');
  out.overwrite(shard_prefix_bytes, text.data(), text.size());
  const auto w = out.commit();
  f.bytes = w.bytes;
  f.sha256 = w.sha256;
  return f;
}

/// Writes one ps's table file of checkpoint `name` (crash-safely; layout in
/// dtf/checkpoint/table_file.hpp). Returns its file record.
/// Errors: invalid_argument when `name` is not a plain file name; io_error.
inline checkpoint_table_file write_table_file(const std::filesystem::path& dir, const std::string& name,
                                              std::size_t ps, std::size_t num_ps,
                                              const std::vector<table_snapshot>& tables,
                                              const checkpoint_fault& fault = {}) {
  if (!confined_name(manifest_file_name(name)) || ps >= num_ps)
    throw error(errc::invalid_argument, "write_table_file: '" + name.substr(0, 64) + "' (ps " + std::to_string(ps) +
                                            " of " + std::to_string(num_ps) + ") names no file inside " + dir.string());
  nlohmann::json header{{"format", 1}, {"ps", ps}, {"num_ps", num_ps}, {"tables", nlohmann::json::array()}};
  for (const auto& t : tables) {
    auto e = table_to_json(t.table);
    e["shards"] = nlohmann::json::array();
    for (const auto& s : t.shards) {
      DTF_ASSERT(s.records.size() == s.rows * t.table.record_bytes(), "a table shard's records are its rows");
      e["shards"].push_back({{"shard", s.index}, {"iterations", s.iterations}, {"rows", s.rows}});
    }
    header["tables"].push_back(std::move(e));
  }
  const std::string text = header.dump();
  std::uint64_t len = text.size();
  std::vector<piece> pieces{{table_magic, sizeof table_magic}, {&len, sizeof len}, {text.data(), text.size()}};
  for (const auto& t : tables)
    for (const auto& s : t.shards) pieces.push_back({s.records.data(), s.records.size()});
  checkpoint_table_file f{table_file_name(name, ps, num_ps), ps, 0, {}};
  const auto w = write_atomically(dir / f.name, pieces, fault);
  f.bytes = w.bytes;
  f.sha256 = w.sha256;
  return f;
}

}  // namespace detail::ckpt

/// Writes DIR/checkpoint crash-safely. Errors: invalid_argument for a name that is not a plain
/// file name inside DIR.
inline void write_checkpoint_state(const std::filesystem::path& dir, const checkpoint_state& s) {
  const nlohmann::json j{{"latest", s.latest}, {"all", s.all}};
  try {
    (void)checkpoint_state::from_json(j, "write_checkpoint_state");
  } catch (const error& e) {
    throw error(errc::invalid_argument, e.what());
  }
  detail::ckpt::write_text_atomically(dir / checkpoint_state_name, j.dump(2) + "\n");
}

/// Writes NAME.manifest.json and then the state file naming NAME as the latest; prunes the
/// oldest checkpoints beyond max_to_keep (0 keeps all), deleting their files and the debris
/// of failed saves with the same prefix. Returns the names pruned. The chief calls this once
/// every shard file is written. Errors: invalid_argument for a manifest a reader would refuse.
inline std::vector<std::string> commit_checkpoint(const std::filesystem::path& dir, const checkpoint_manifest& m,
                                                  std::size_t max_to_keep) {
  try {  // what this writes, the reader accepts
    (void)checkpoint_manifest::from_json(m.to_json(), "commit_checkpoint: manifest " + m.name);
  } catch (const error& e) {
    throw error(errc::invalid_argument, e.what());
  }
  detail::ckpt::write_text_atomically(dir / detail::ckpt::manifest_file_name(m.name), m.to_json().dump(1) + "\n");
  checkpoint_state s = read_checkpoint_state(dir).value_or(checkpoint_state{});
  s.all.erase(std::remove(s.all.begin(), s.all.end(), m.name), s.all.end());
  s.all.push_back(m.name);
  s.latest = m.name;
  std::vector<std::string> pruned;
  if (max_to_keep != 0 && s.all.size() > max_to_keep) {
    pruned.assign(s.all.begin(), s.all.end() - std::ptrdiff_t(max_to_keep));
    s.all.erase(s.all.begin(), s.all.end() - std::ptrdiff_t(max_to_keep));
  }
  write_checkpoint_state(dir, s);
  // Deleted only after the state file stopped naming them: a crash here leaves orphans, never
  // a named checkpoint with missing files. The same sweep removes the debris of saves that
  // died before their commit (shard files and temporaries of a checkpoint that no state file
  // names): files "<prefix>-<digits>.*" of this checkpoint's prefix whose name is not kept,
  // and temporaries of the state file ("checkpoint.tmp.*", written by this chief alone).
  const auto dash = m.name.rfind('-');
  const std::string prefix = dash == std::string::npos ? std::string() : m.name.substr(0, dash + 1);
  const std::string state_tmp = std::string(checkpoint_state_name) + ".tmp.";
  auto kept = [&](const std::string& n) { return std::find(s.all.begin(), s.all.end(), n) != s.all.end(); };
  std::error_code ec;
  std::vector<std::filesystem::path> doomed;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto file = e.path().filename().string();
    if (file.rfind(state_tmp, 0) == 0) {
      doomed.push_back(e.path());
      continue;
    }
    if (prefix.empty() || file.rfind(prefix, 0) != 0) continue;
    const auto dot = file.find('.', prefix.size());
    if (dot == std::string::npos || dot == prefix.size()) continue;
    const auto digits = file.substr(prefix.size(), dot - prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!kept(file.substr(0, dot))) doomed.push_back(e.path());
  }
  // Manifests first, so a half-deleted checkpoint is visibly incomplete.
  std::stable_partition(doomed.begin(), doomed.end(),
                        [](const auto& p) { return p.filename().string().ends_with(".manifest.json"); });
  for (const auto& p : doomed) std::filesystem::remove(p, ec);
  return pruned;
}

/// The state of a model held whole by one process (collective strategies: every rank holds
/// the same replica), as host buffers laid out as `variables` describes.
struct host_checkpoint_state {
  /// The variables, laid out in the buffers in this order.
  std::vector<variable_spec> variables;
  std::span<const float> values;                    ///< the flat parameters
  std::string rule = "sgd";                         ///< the update rule's name (optim rule `name`)
  std::vector<std::span<const float>> slots;        ///< the rule's slots (0..2), each like values
  std::int64_t iterations = 0;                      ///< updates the rule applied (Adam's t)
  /// The global step to save.
  std::int64_t global_step = 0;
};

namespace detail::ckpt {

/// The variables of `state`, each whole in one shard of ps 0's file: their entries in `m`
/// (variables, shards, rule and slot count) and the file's records (pointing into `state`).
/// Errors: errc::invalid_argument (a slot or variable that does not fit the values, a rule
/// whose slot count differs).
inline std::vector<shard_record> whole_variables(const host_checkpoint_state& state, checkpoint_manifest& m) {
  const std::string rule = state.rule.empty() ? "sgd" : state.rule;
  const int rule_slots = detail::ckpt::rule_slots(rule);
  if (rule_slots < 0 || std::size_t(rule_slots) != state.slots.size())
    throw error(errc::invalid_argument, "write_checkpoint: " + std::to_string(state.slots.size()) + " slots for rule '" +
                                            rule + "' (one of " + detail::ckpt::rule_names() + ")");
  for (const auto& s : state.slots)
    if (s.size() != state.values.size())
      throw error(errc::invalid_argument, "write_checkpoint: a slot of " + std::to_string(s.size()) +
                                              " floats for " + std::to_string(state.values.size()) + " values");
  m.rule = rule;
  m.num_slots = state.slots.size();
  std::vector<shard_record> records;
  for (std::size_t i = 0; i < state.variables.size(); ++i) {
    const auto& v = state.variables[i];
    if (v.offset > state.values.size() || v.size() > state.values.size() - v.offset)
      throw error(errc::invalid_argument, "write_checkpoint: variable '" + v.name + "' lies outside the " +
                                              std::to_string(state.values.size()) + " values");
    const std::size_t index = m.variables.size();
    m.variables.push_back({v.name, v.shape, v.offset, state.iterations});
    m.shards.push_back({std::uint32_t(index), index, 0, 0, 0, v.shape.empty() ? 1 : v.shape[0], v.offset, v.size()});
    shard_record r{.id = std::uint32_t(index), .size = v.size(), .iterations = state.iterations, .tensors = {}};
    r.tensors.push_back(state.values.data() + v.offset);
    for (const auto& s : state.slots) r.tensors.push_back(s.data() + v.offset);
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace detail::ckpt

/// Saves a checkpoint from one process's host buffers in the same format the ps tasks write
/// (one shard file "NAME.ps-0-of-1.shard" holding every variable whole, then the manifest and
/// the state file; crash-safe; max_to_keep pruning), so checkpoint_reader, restore and
/// dtf-ckpt treat it like any other. NAME is "<prefix>-<global_step>". Returns the manifest
/// written. Errors: errc::invalid_argument (a slot or variable that does not fit the values,
/// a rule whose slot count differs), errc::io_error (a file cannot be written).
inline checkpoint_manifest write_checkpoint(const checkpoint_options& options, const host_checkpoint_state& state,
                                            const checkpoint_fault& fault = {}) {
  checkpoint_manifest m;
  m.name = options.prefix + "-" + std::to_string(state.global_step);
  m.global_step = state.global_step;
  m.num_ps = 1;
  const auto records = detail::ckpt::whole_variables(state, m);
  m.files.push_back(detail::ckpt::write_shard_file(options.directory, m.name, 0, 1, state.global_step, m.num_slots,
                                                   records, fault));
  commit_checkpoint(options.directory, m, options.max_to_keep);
  return m;
}

namespace detail::ckpt {

// A .npy file of `elements` items of NumPy type `descr` (e.g. '<f4') in `bytes`.
inline void write_npy_bytes(const std::filesystem::path& path, const char* descr, const dims& shape,
                            std::size_t elements, const void* bytes, std::size_t size) {
  if (num_elements(shape) != elements)
    throw error(errc::shape_mismatch, "write_npy: " + std::to_string(elements) + " elements for shape " +
                                          to_string(shape));
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) dict += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  dict += "), }";
  // magic(6) + version(2) + header length(2) + dict + padding + '\n' is a multiple of 64.
  std::size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string head = "\x93NUMPY";
  head += char(1);
  head += char(0);
  const auto len = std::uint16_t(dict.size());
  head += char(len & 0xff);
  head += char(len >> 8);
  head += dict;
  const piece pieces[] = {{head.data(), head.size()}, {bytes, size}};
  write_atomically(path, pieces);
}

}  // namespace detail::ckpt

/// Writes a float32 array as a NumPy .npy file (format 1.0, little-endian '<f4', C order),
/// crash-safely.
inline void write_npy(const std::filesystem::path& path, const dims& shape, std::span<const float> data) {
  detail::ckpt::write_npy_bytes(path, "<f4", shape, data.size(), data.data(), data.size_bytes());
}

/// The same for a uint64 array ('<u8'): an embedding table's ids.
inline void write_npy(const std::filesystem::path& path, const dims& shape, std::span<const std::uint64_t> data) {
  detail::ckpt::write_npy_bytes(path, "<u8", shape, data.size(), data.data(), data.size_bytes());
}

}  // namespace dtf
