// dtf/checkpoint/writer.hpp — writing checkpoint files crash-safely and without trusting the
// directory's contents.
//
// Every file is written to a fresh temporary name FINAL.tmp.<16 random hex digits>, opened
// with O_CREAT|O_EXCL|O_NOFOLLOW (so whatever sits in the directory — a symlink planted at a
// predictable name, yesterday's debris — is never written through or truncated), flushed
// (fsync), renamed over FINAL, and the directory is synced. Names written are checked to be
// plain file names inside the directory.
//
// Thread safety: free functions; saving into one directory is the chief's job (one writer of
// the manifest and state file). Errors: errc::io_error (a file cannot be created, written,
// renamed), errc::invalid_argument (a name or state that cannot be written).
#pragma once

#include <dtf/checkpoint/format.hpp>
#include <dtf/checkpoint/reader.hpp>
#include <dtf/detail/sha256.hpp>
#include <dtf/error.hpp>
#include <dtf/variable.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <cstring>
#include <filesystem>
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

/// Testing aid for crash safety: makes a write stop after `abort_after_bytes` bytes of a file,
/// leaving its temporary file on disk as a crash would, and throw errc::io_error — or, with
/// kill_process, SIGKILL this very process there (a real crash in the middle of a save).
struct checkpoint_fault {
  std::uint64_t abort_after_bytes = 0;  ///< 0: off
  /// SIGKILL this process at that point instead of throwing.
  bool kill_process = false;
  /// Tests: called on a parameter server's save thread before it writes its files.
  std::function<void()> before_write;
};

namespace detail::ckpt {

/// A contiguous byte range to write.
struct piece {
  const void* data;
  std::size_t size;
};

/// What was written.
struct written {
  std::uint64_t bytes = 0;
  std::string sha256;
};

inline void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw error(errc::io_error, "cannot open directory " + dir.string() + ": " + errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0 && saved != EINVAL)  // some file systems cannot sync a directory
    throw error(errc::io_error, "cannot sync directory " + dir.string() + ": " + std::strerror(saved));
}

/// 16 hex digits from the kernel's random source: a temporary name nobody predicted.
inline std::string random_suffix() {
  std::uint64_t r = 0;
  auto* at = reinterpret_cast<char*>(&r);
  for (std::size_t got = 0; got < sizeof r;) {
    const ssize_t n = ::getrandom(at + got, sizeof r - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw error(errc::io_error, std::string("getrandom: ") + errno_text());
    }
    got += std::size_t(n);
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (std::size_t i = 0; i < 16; ++i) s[i] = hex[(r >> (4 * i)) & 0xf];
  return s;
}

/// Creates FINAL.tmp.<random> exclusively, never through a symlink. Returns its descriptor.
inline int create_temporary(const std::filesystem::path& path, std::filesystem::path& tmp) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    tmp = std::filesystem::path(path.string() + ".tmp." + random_suffix());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST) throw error(errc::io_error, "cannot create " + tmp.string() + ": " + errno_text());
  }
  throw error(errc::io_error, "cannot create a temporary file beside " + path.string() + ": every name taken");
}

/// Writes `pieces` to `path` crash-safely (see the file comment).
inline written write_atomically(const std::filesystem::path& path, std::span<const piece> pieces,
                                const checkpoint_fault& fault = {}) {
  std::filesystem::path tmp;
  const int fd = create_temporary(path, tmp);
  sha256 h;
  written w;
  auto fail = [&](const std::string& what) {
    if (fault.kill_process && what.rfind("fault injection", 0) == 0) ::kill(::getpid(), SIGKILL);
    ::close(fd);
    throw error(errc::io_error, what);
  };
  for (const auto& p : pieces) {
    const auto* at = static_cast<const char*>(p.data);
    std::size_t left = p.size;
    h.update(p.data, p.size);
    while (left > 0) {
      std::size_t chunk = std::min<std::size_t>(left, std::size_t(1) << 30);
      if (fault.abort_after_bytes != 0) {
        if (w.bytes >= fault.abort_after_bytes)
          fail("fault injection: write of " + path.string() + " aborted after " + std::to_string(w.bytes) + " bytes");
        chunk = std::min<std::size_t>(chunk, fault.abort_after_bytes - w.bytes);
      }
      const ssize_t n = ::write(fd, at, chunk);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("cannot write " + tmp.string() + ": " + errno_text());
      }
      at += n;
      left -= std::size_t(n);
      w.bytes += std::uint64_t(n);
    }
  }
  if (fault.abort_after_bytes != 0 && w.bytes >= fault.abort_after_bytes)
    fail("fault injection: write of " + path.string() + " aborted after " + std::to_string(w.bytes) + " bytes");
  if (::fsync(fd) != 0) fail("cannot sync " + tmp.string() + ": " + errno_text());
  if (::close(fd) != 0) throw error(errc::io_error, "cannot close " + tmp.string() + ": " + errno_text());
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw error(errc::io_error, "cannot rename " + tmp.string() + " to " + path.string() + ": " + errno_text());
  fsync_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
  w.sha256 = h.hex();
  return w;
}

inline written write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  const piece p{text.data(), text.size()};
  return write_atomically(path, std::span<const piece>(&p, 1));
}

/// One shard as a ps saves it: its values and slots (pointers into a snapshot).
struct shard_record {
  std::uint32_t id = 0;
  std::uint64_t size = 0;
  std::int64_t iterations = 0;
  std::vector<const float*> tensors;  ///< values, then num_slots slots
};

/// Writes one ps's shard file of checkpoint `name` (crash-safely). Returns its file record.
/// Errors: invalid_argument when `name` is not a plain file name; io_error.
inline checkpoint_file write_shard_file(const std::filesystem::path& dir, const std::string& name, std::size_t ps,
                                        std::size_t num_ps, std::int64_t global_step, std::size_t num_slots,
                                        const std::vector<shard_record>& records, const checkpoint_fault& fault = {}) {
  if (!confined_name(manifest_file_name(name)) || ps >= num_ps)
    throw error(errc::invalid_argument, "write_shard_file: '" + name.substr(0, 64) + "' (ps " + std::to_string(ps) +
                                            " of " + std::to_string(num_ps) + ") names no file inside " + dir.string());
  nlohmann::json header{{"format", 1}, {"ps", ps}, {"num_ps", num_ps}, {"global_step", global_step},
                        {"num_slots", num_slots}, {"entries", nlohmann::json::array()}};
  for (const auto& r : records) {
    DTF_ASSERT(r.tensors.size() == 1 + num_slots, "a shard record carries its values and every slot");
    header["entries"].push_back({{"shard", r.id}, {"size", r.size}, {"iterations", r.iterations}});
  }
  const std::string text = header.dump();
  std::uint64_t len = text.size();
  std::vector<piece> pieces{{shard_magic, sizeof shard_magic}, {&len, sizeof len}, {text.data(), text.size()}};
  for (const auto& r : records)
    for (const float* t : r.tensors) pieces.push_back({t, r.size * sizeof(float)});
  checkpoint_file f;
  f.name = shard_file_name(name, ps, num_ps);
  f.ps = ps;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw error(errc::io_error, "cannot create checkpoint directory " + dir.string() + ": " + ec.message());
  const auto w = write_atomically(dir / f.name, pieces, fault);
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

/// Saves a checkpoint from one process's host buffers in the same format the ps tasks write
/// (one shard file "NAME.ps-0-of-1.shard" holding every variable whole, then the manifest and
/// the state file; crash-safe; max_to_keep pruning), so checkpoint_reader, restore and
/// dtf-ckpt treat it like any other. NAME is "<prefix>-<global_step>". Returns the manifest
/// written. Errors: errc::invalid_argument (a slot or variable that does not fit the values,
/// a rule whose slot count differs), errc::io_error (a file cannot be written).
inline checkpoint_manifest write_checkpoint(const checkpoint_options& options, const host_checkpoint_state& state,
                                            const checkpoint_fault& fault = {}) {
  const std::string rule = state.rule.empty() ? "sgd" : state.rule;
  const int rule_slots = detail::ckpt::rule_slots(rule);
  if (rule_slots < 0 || std::size_t(rule_slots) != state.slots.size())
    throw error(errc::invalid_argument, "write_checkpoint: " + std::to_string(state.slots.size()) + " slots for rule '" +
                                            rule + "' (one of " + detail::ckpt::rule_names() + ")");
  for (const auto& s : state.slots)
    if (s.size() != state.values.size())
      throw error(errc::invalid_argument, "write_checkpoint: a slot of " + std::to_string(s.size()) +
                                              " floats for " + std::to_string(state.values.size()) + " values");
  checkpoint_manifest m;
  m.name = options.prefix + "-" + std::to_string(state.global_step);
  m.global_step = state.global_step;
  m.num_ps = 1;
  m.rule = rule;
  m.num_slots = state.slots.size();
  std::vector<detail::ckpt::shard_record> records;
  for (std::size_t i = 0; i < state.variables.size(); ++i) {
    const auto& v = state.variables[i];
    if (v.offset > state.values.size() || v.size() > state.values.size() - v.offset)
      throw error(errc::invalid_argument, "write_checkpoint: variable '" + v.name + "' lies outside the " +
                                              std::to_string(state.values.size()) + " values");
    m.variables.push_back({v.name, v.shape, v.offset, state.iterations});
    m.shards.push_back({std::uint32_t(i), i, 0, 0, 0, v.shape.empty() ? 1 : v.shape[0], v.offset, v.size()});
    detail::ckpt::shard_record r{.id = std::uint32_t(i), .size = v.size(), .iterations = state.iterations, .tensors = {}};
    r.tensors.push_back(state.values.data() + v.offset);
    for (const auto& s : state.slots) r.tensors.push_back(s.data() + v.offset);
    records.push_back(std::move(r));
  }
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
