// dtf/checkpoint.hpp — sharded checkpoints on disk (DESIGN.md §7).
//
// A checkpoint named NAME (by default "ckpt-<global step>") in directory DIR is:
//   DIR/NAME.ps-I-of-N.shard   one file per ps task I: the shards it held (values, then the
//                              update rule's slots: momentum, Adagrad accumulators, Adam's m
//                              and v), with each shard's update count (Adam's t)
//   DIR/NAME.manifest.json     written by the chief after every shard file: the variables
//                              (name, shape, dtype, place in the flat buffer), the shard layout
//                              (which rows of which variable each ps held), the global step,
//                              the update rule, and every shard file's size and SHA-256
//   DIR/checkpoint             the state file: {"latest": NAME, "all": [kept names, oldest first]}
//
// Shard file format (little-endian):
//   0   8  magic "DTFSHRD1"
//   8   8  header length H
//   16  H  header (JSON): {"format":1,"ps":I,"num_ps":N,"global_step":S,"num_slots":K,
//                          "entries":[{"shard":id,"size":elements,"iterations":t}, ...]}
//   ... raw float32: for each entry in order, its values then its K slots (size floats each)
// Tensor bytes are written raw, never through a serialisation archive; JSON holds only the
// metadata.
//
// Crash safety: every file is written under a temporary name (FINAL.tmp), flushed to disk
// (fsync), renamed over its final name, and the directory is synced. A checkpoint exists for
// a reader only once the state file names it, which happens after its manifest is in place,
// which happens after every shard file is; so a crash at any point of a save leaves the
// previous checkpoint as the latest, intact. Restore verifies every file's size and SHA-256
// against the manifest before it uses a byte.
//
// Resharding: read_checkpoint() assembles the full variables (and slots) from however many
// shard files were written; the caller re-slices them for its own placement (ps_client's
// restore does this), so a checkpoint saved by 2 ps tasks restores into 1 or 3.
//
// Thread safety: free functions on distinct checkpoints may run concurrently; saving into one
// directory is the chief's job (one writer of the manifest and state file).
// Errors: dtf::error with errc::io_error (a file cannot be opened, written, renamed),
// errc::corrupt_data (a checksum, size, magic, header or layout does not match, naming the file),
// errc::invalid_argument / shape_mismatch (a variable missing or of another shape).
#pragma once

#include <dtf/detail/sha256.hpp>
#include <dtf/error.hpp>
#include <dtf/shape.hpp>
#include <dtf/variable.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dtf {

static_assert(std::endian::native == std::endian::little,
              "dtf checkpoints store float32 little-endian: a big-endian host would need byte swapping");

/// Name of the state file in a checkpoint directory.
inline constexpr const char* checkpoint_state_name = "checkpoint";

/// One variable in a checkpoint.
struct checkpoint_variable {
  std::string name;
  dims shape;
  std::size_t offset = 0;       ///< first element in the saved flat buffer
  std::int64_t iterations = 0;  ///< updates its update rule had applied (Adam's t)
  std::size_t size() const noexcept { return num_elements(shape); }
};

/// One shard in a checkpoint: rows [row_begin, row_end) of a variable, held by ps `ps`.
struct checkpoint_shard {
  std::uint32_t id = 0;  ///< shard id in the saving placement
  std::size_t variable = 0, part = 0, ps = 0, row_begin = 0, row_end = 0, offset = 0, size = 0;
};

/// One shard file and its checksum.
struct checkpoint_file {
  std::string name;  ///< relative to the checkpoint directory
  std::size_t ps = 0;
  std::uint64_t bytes = 0;
  std::string sha256;  ///< 64 hex digits of the whole file
};

/// The manifest: everything about a checkpoint except the tensor bytes.
struct checkpoint_manifest {
  std::string name;
  std::int64_t global_step = 0;
  std::string dtype = "float32";
  std::size_t num_ps = 0;
  std::string rule = "sgd";  ///< update rule whose slots were saved
  std::size_t num_slots = 0;
  std::vector<checkpoint_variable> variables;
  std::vector<checkpoint_shard> shards;
  std::vector<checkpoint_file> files;

  /// Elements of the saved flat buffer.
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

  nlohmann::json to_json() const {
    nlohmann::json j;
    j["format"] = "dtf-checkpoint-1";
    j["name"] = name;
    j["global_step"] = global_step;
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
    return j;
  }

  /// Parses and checks a manifest; `what` names its file in errors.
  static checkpoint_manifest from_json(const nlohmann::json& j, const std::string& what) {
    checkpoint_manifest m;
    try {
      if (j.at("format").get<std::string>() != "dtf-checkpoint-1")
        throw error(errc::corrupt_data, what + ": unknown format '" + j.at("format").get<std::string>() + "'");
      m.name = j.at("name").get<std::string>();
      m.global_step = j.at("global_step").get<std::int64_t>();
      m.dtype = j.at("dtype").get<std::string>();
      m.num_ps = j.at("num_ps").get<std::size_t>();
      m.rule = j.at("rule").get<std::string>();
      m.num_slots = j.at("num_slots").get<std::size_t>();
      for (const auto& v : j.at("variables"))
        m.variables.push_back({v.at("name").get<std::string>(), v.at("shape").get<dims>(), v.at("offset").get<std::size_t>(),
                               v.at("iterations").get<std::int64_t>()});
      for (const auto& s : j.at("shards"))
        m.shards.push_back({s.at("id").get<std::uint32_t>(), s.at("variable").get<std::size_t>(),
                            s.at("part").get<std::size_t>(), s.at("ps").get<std::size_t>(),
                            s.at("row_begin").get<std::size_t>(), s.at("row_end").get<std::size_t>(),
                            s.at("offset").get<std::size_t>(), s.at("size").get<std::size_t>()});
      for (const auto& f : j.at("files"))
        m.files.push_back({f.at("name").get<std::string>(), f.at("ps").get<std::size_t>(),
                           f.at("bytes").get<std::uint64_t>(), f.at("sha256").get<std::string>()});
    } catch (const nlohmann::json::exception& e) {
      throw error(errc::corrupt_data, what + ": malformed manifest: " + e.what());
    }
    if (m.dtype != "float32") throw error(errc::corrupt_data, what + ": dtype '" + m.dtype + "' (only float32 is supported)");
    if (m.num_slots > 2) throw error(errc::corrupt_data, what + ": " + std::to_string(m.num_slots) + " slots (at most 2)");
    for (const auto& s : m.shards) {
      if (s.variable >= m.variables.size())
        throw error(errc::corrupt_data, what + ": shard " + std::to_string(s.id) + " names variable " +
                                            std::to_string(s.variable) + " of " + std::to_string(m.variables.size()));
      const auto& v = m.variables[s.variable];
      if (s.offset < v.offset || s.size > v.size() || s.offset - v.offset > v.size() - s.size)
        throw error(errc::corrupt_data, what + ": shard " + std::to_string(s.id) + " lies outside variable '" + v.name + "'");
      if (s.ps >= m.num_ps)
        throw error(errc::corrupt_data, what + ": shard " + std::to_string(s.id) + " on ps " + std::to_string(s.ps) +
                                            " of " + std::to_string(m.num_ps));
    }
    return m;
  }
};

/// The state file: the latest checkpoint and every kept one (oldest first).
struct checkpoint_state {
  std::string latest;
  std::vector<std::string> all;
};

/// The full contents of a checkpoint in its saved flat layout (manifest.variables' offsets).
struct checkpoint_tensors {
  checkpoint_manifest manifest;
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
  bool kill_process = false;
};

namespace detail::ckpt {

inline std::string errno_text() { return std::strerror(errno); }

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
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw error(errc::io_error, "cannot open directory " + dir.string() + ": " + errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0 && saved != EINVAL)  // some file systems cannot sync a directory
    throw error(errc::io_error, "cannot sync directory " + dir.string() + ": " + std::strerror(saved));
}

/// Writes `pieces` to `path` crash-safely: path.tmp, write, fsync, rename, fsync directory.
inline written write_atomically(const std::filesystem::path& path, std::span<const piece> pieces,
                                const checkpoint_fault& fault = {}) {
  const auto tmp = std::filesystem::path(path.string() + ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error(errc::io_error, "cannot create " + tmp.string() + ": " + errno_text());
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

inline std::vector<char> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(errc::io_error, "cannot open " + path.string());
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  if (size < 0) throw error(errc::io_error, "cannot read " + path.string());
  in.seekg(0);
  std::vector<char> data(static_cast<std::size_t>(size));
  if (!in.read(data.data(), size)) throw error(errc::io_error, "cannot read " + path.string());
  return data;
}

inline nlohmann::json parse_json(const std::vector<char>& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_data, what + ": malformed JSON: " + e.what());
  }
}

inline constexpr char shard_magic[8] = {'D', 'T', 'F', 'S', 'H', 'R', 'D', '1'};

/// One shard as a ps saves it: its values and slots (pointers into a snapshot).
struct shard_record {
  std::uint32_t id = 0;
  std::uint64_t size = 0;
  std::int64_t iterations = 0;
  std::vector<const float*> tensors;  ///< values, then num_slots slots
};

/// A shard file's parsed header and where its tensor bytes start.
struct shard_header {
  std::size_t ps = 0, num_ps = 0, num_slots = 0;
  std::int64_t global_step = 0;
  struct entry {
    std::uint32_t id;
    std::uint64_t size;
    std::int64_t iterations;
  };
  std::vector<entry> entries;
  std::size_t data_offset = 0;
};

inline std::string shard_file_name(const std::string& name, std::size_t ps, std::size_t num_ps) {
  return name + ".ps-" + std::to_string(ps) + "-of-" + std::to_string(num_ps) + ".shard";
}
inline std::string manifest_file_name(const std::string& name) { return name + ".manifest.json"; }

/// Writes one ps's shard file (crash-safely). Returns its file record.
inline checkpoint_file write_shard_file(const std::filesystem::path& dir, const std::string& name, std::size_t ps,
                                        std::size_t num_ps, std::int64_t global_step, std::size_t num_slots,
                                        const std::vector<shard_record>& records, const checkpoint_fault& fault = {}) {
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

inline shard_header parse_shard_header(const std::vector<char>& data, const std::string& what) {
  if (data.size() < 16 || std::memcmp(data.data(), shard_magic, sizeof shard_magic) != 0)
    throw error(errc::corrupt_data, what + ": not a dtf shard file (bad magic)");
  std::uint64_t len = 0;
  std::memcpy(&len, data.data() + 8, sizeof len);
  if (len > data.size() - 16) throw error(errc::corrupt_data, what + ": header length exceeds the file");
  const std::vector<char> text(data.begin() + 16, data.begin() + 16 + std::ptrdiff_t(len));
  const auto j = parse_json(text, what);
  shard_header h;
  try {
    h.ps = j.at("ps").get<std::size_t>();
    h.num_ps = j.at("num_ps").get<std::size_t>();
    h.num_slots = j.at("num_slots").get<std::size_t>();
    h.global_step = j.at("global_step").get<std::int64_t>();
    for (const auto& e : j.at("entries"))
      h.entries.push_back({e.at("shard").get<std::uint32_t>(), e.at("size").get<std::uint64_t>(),
                           e.at("iterations").get<std::int64_t>()});
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_data, what + ": malformed shard header: " + e.what());
  }
  if (h.num_slots > 2) throw error(errc::corrupt_data, what + ": " + std::to_string(h.num_slots) + " slots (at most 2)");
  h.data_offset = 16 + std::size_t(len);
  std::uint64_t floats = 0;
  for (const auto& e : h.entries) {
    if (e.size > (data.size() / sizeof(float)) || floats > data.size() / sizeof(float))
      throw error(errc::corrupt_data, what + ": entry sizes exceed the file");
    floats += e.size * (1 + h.num_slots);
  }
  if (h.data_offset + floats * sizeof(float) != data.size())
    throw error(errc::corrupt_data, what + ": " + std::to_string(data.size()) + " bytes, the header describes " +
                                        std::to_string(h.data_offset + floats * sizeof(float)));
  return h;
}

}  // namespace detail::ckpt

/// Reads DIR/checkpoint; nullopt when there is none. Errors: errc::corrupt_data (malformed).
inline std::optional<checkpoint_state> read_checkpoint_state(const std::filesystem::path& dir) {
  const auto path = dir / checkpoint_state_name;
  if (!std::filesystem::exists(path)) return std::nullopt;
  const auto j = detail::ckpt::parse_json(detail::ckpt::read_file(path), path.string());
  checkpoint_state s;
  try {
    s.latest = j.at("latest").get<std::string>();
    s.all = j.at("all").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw error(errc::corrupt_data, path.string() + ": malformed state file: " + e.what());
  }
  return s;
}

/// Writes DIR/checkpoint crash-safely.
inline void write_checkpoint_state(const std::filesystem::path& dir, const checkpoint_state& s) {
  const nlohmann::json j{{"latest", s.latest}, {"all", s.all}};
  detail::ckpt::write_text_atomically(dir / checkpoint_state_name, j.dump(2) + "\n");
}

/// The name of the latest checkpoint in dir, or nullopt (TensorFlow's tf.train.latest_checkpoint).
inline std::optional<std::string> latest_checkpoint(const std::filesystem::path& dir) {
  auto s = read_checkpoint_state(dir);
  if (!s || s->latest.empty()) return std::nullopt;
  return s->latest;
}

/// Reads and parses NAME.manifest.json (no shard file is read).
inline checkpoint_manifest read_manifest(const std::filesystem::path& dir, const std::string& name) {
  const auto path = dir / detail::ckpt::manifest_file_name(name);
  if (!std::filesystem::exists(path))
    throw error(errc::io_error, "checkpoint '" + name + "' has no manifest " + path.string());
  return checkpoint_manifest::from_json(detail::ckpt::parse_json(detail::ckpt::read_file(path), path.string()),
                                        path.string());
}

/// Reads a checkpoint, verifying every shard file's size and SHA-256 and that its shards tile
/// every variable exactly once, and assembles the full variables and slots.
inline checkpoint_tensors read_checkpoint(const std::filesystem::path& dir, const std::string& name) {
  checkpoint_tensors t;
  t.manifest = read_manifest(dir, name);
  const auto& m = t.manifest;
  const std::size_t n = m.num_parameters();
  t.values.assign(n, 0.0f);
  t.slots.assign(m.num_slots, std::vector<float>(n, 0.0f));
  std::vector<bool> found(m.shards.size(), false);
  std::vector<std::int64_t> var_iterations(m.variables.size(), -1);
  for (const auto& f : m.files) {
    const auto path = dir / f.name;
    const auto data = detail::ckpt::read_file(path);
    if (data.size() != f.bytes)
      throw error(errc::corrupt_data, path.string() + ": " + std::to_string(data.size()) + " bytes, the manifest says " +
                                          std::to_string(f.bytes));
    const auto sum = detail::sha256_hex(data.data(), data.size());
    if (sum != f.sha256)
      throw error(errc::corrupt_data, path.string() + ": SHA-256 " + sum + " does not match the manifest's " + f.sha256);
    const auto h = detail::ckpt::parse_shard_header(data, path.string());
    if (!h.entries.empty() && h.num_slots != m.num_slots)  // a ps holding no shard knows no rule
      throw error(errc::corrupt_data, path.string() + ": " + std::to_string(h.num_slots) + " slots, the manifest says " +
                                          std::to_string(m.num_slots));
    std::size_t at = h.data_offset;
    for (const auto& e : h.entries) {
      auto it = std::find_if(m.shards.begin(), m.shards.end(), [&](const checkpoint_shard& s) { return s.id == e.id; });
      if (it == m.shards.end())
        throw error(errc::corrupt_data, path.string() + ": shard " + std::to_string(e.id) + " is not in the manifest");
      const auto k = std::size_t(it - m.shards.begin());
      if (found[k] || it->size != e.size || it->ps != f.ps)
        throw error(errc::corrupt_data, path.string() + ": shard " + std::to_string(e.id) +
                                            " is duplicated or differs from the manifest");
      found[k] = true;
      for (std::size_t tensor = 0; tensor <= m.num_slots; ++tensor) {
        auto& dst = tensor == 0 ? t.values : t.slots[tensor - 1];
        std::memcpy(dst.data() + it->offset, data.data() + at, e.size * sizeof(float));
        at += e.size * sizeof(float);
      }
      auto& vi = var_iterations[it->variable];
      vi = std::max(vi, e.iterations);
    }
  }
  // Every variable covered exactly once by its shards.
  std::vector<std::size_t> covered(m.variables.size(), 0);
  for (std::size_t k = 0; k < m.shards.size(); ++k) {
    if (!found[k])
      throw error(errc::corrupt_data, "checkpoint '" + name + "': shard " + std::to_string(m.shards[k].id) +
                                          " is in no shard file");
    covered[m.shards[k].variable] += m.shards[k].size;
  }
  for (std::size_t v = 0; v < m.variables.size(); ++v)
    if (covered[v] != m.variables[v].size())
      throw error(errc::corrupt_data, "checkpoint '" + name + "': the shards of '" + m.variables[v].name + "' cover " +
                                          std::to_string(covered[v]) + " of " +
                                          std::to_string(m.variables[v].size()) + " elements");
  return t;
}

/// Verifies a checkpoint (every checksum, size and the layout); returns its manifest.
inline checkpoint_manifest verify_checkpoint(const std::filesystem::path& dir, const std::string& name) {
  return read_checkpoint(dir, name).manifest;
}

/// Copies a checkpoint's values (slot < 0) or a slot into `out`, laid out as `vars` (the
/// restoring model's variables: matched by name, shapes must agree; a variable of vars that
/// the checkpoint lacks is an error). Returns nothing; errors name the variable.
inline void copy_into_layout(const checkpoint_tensors& t, const std::vector<variable_spec>& vars, std::span<float> out,
                             int slot = -1) {
  for (const auto& v : vars) {
    const auto* sv = t.manifest.find(v.name);
    if (!sv)
      throw error(errc::invalid_argument, "checkpoint " + t.manifest.name + " has no variable '" + v.name + "'");
    if (sv->shape != v.shape)
      throw error(errc::shape_mismatch, "variable '" + v.name + "' is " + to_string(sv->shape) + " in checkpoint " +
                                            t.manifest.name + " but " + to_string(v.shape) + " in the model");
    if (v.offset + v.size() > out.size())
      throw error(errc::shape_mismatch, "copy_into_layout: buffer too small for variable '" + v.name + "'");
    const auto src = t.variable(v.name, slot);
    std::copy(src.begin(), src.end(), out.begin() + std::ptrdiff_t(v.offset));
  }
}

/// Writes NAME.manifest.json and then the state file naming NAME as the latest; prunes the
/// oldest checkpoints beyond max_to_keep (0 keeps all), deleting their files and the debris
/// of failed saves with the same prefix. Returns the names pruned. The chief calls this once
/// every shard file is written.
inline std::vector<std::string> commit_checkpoint(const std::filesystem::path& dir, const checkpoint_manifest& m,
                                                  std::size_t max_to_keep) {
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
  // names): files "<prefix>-<digits>.*" of this checkpoint's prefix whose name is not kept.
  const auto dash = m.name.rfind('-');
  const std::string prefix = dash == std::string::npos ? std::string() : m.name.substr(0, dash + 1);
  auto kept = [&](const std::string& n) { return std::find(s.all.begin(), s.all.end(), n) != s.all.end(); };
  std::error_code ec;
  std::vector<std::filesystem::path> doomed;
  if (!prefix.empty())
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const auto file = e.path().filename().string();
      if (file.rfind(prefix, 0) != 0) continue;
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
  std::vector<variable_spec> variables;
  std::span<const float> values;                    ///< the flat parameters
  std::string rule = "sgd";                         ///< the update rule's name (optim rule `name`)
  std::vector<std::span<const float>> slots;        ///< the rule's slots (0..2), each like values
  std::int64_t iterations = 0;                      ///< updates the rule applied (Adam's t)
  std::int64_t global_step = 0;
};

/// Saves a checkpoint from one process's host buffers in the same format the ps tasks write
/// (one shard file "NAME.ps-0-of-1.shard" holding every variable whole, then the manifest and
/// the state file; crash-safe; max_to_keep pruning), so read_checkpoint, restore and dtf-ckpt
/// treat it like any other. NAME is "<prefix>-<global_step>". Returns the manifest written.
/// Errors: errc::invalid_argument (a slot or variable that does not fit the values),
/// errc::io_error (a file cannot be written).
inline checkpoint_manifest write_checkpoint(const checkpoint_options& options, const host_checkpoint_state& state,
                                            const checkpoint_fault& fault = {}) {
  if (state.slots.size() > 2)
    throw error(errc::invalid_argument, "write_checkpoint: " + std::to_string(state.slots.size()) + " slots (at most 2)");
  for (const auto& s : state.slots)
    if (s.size() != state.values.size())
      throw error(errc::invalid_argument, "write_checkpoint: a slot of " + std::to_string(s.size()) +
                                              " floats for " + std::to_string(state.values.size()) + " values");
  checkpoint_manifest m;
  m.name = options.prefix + "-" + std::to_string(state.global_step);
  m.global_step = state.global_step;
  m.num_ps = 1;
  m.rule = state.rule.empty() ? "sgd" : state.rule;
  m.num_slots = state.slots.size();
  std::vector<detail::ckpt::shard_record> records;
  for (std::size_t i = 0; i < state.variables.size(); ++i) {
    const auto& v = state.variables[i];
    if (v.offset + v.size() > state.values.size())
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

/// Writes a float32 array as a NumPy .npy file (format 1.0, little-endian '<f4', C order),
/// crash-safely.
inline void write_npy(const std::filesystem::path& path, const dims& shape, std::span<const float> data) {
  if (num_elements(shape) != data.size())
    throw error(errc::shape_mismatch, "write_npy: " + std::to_string(data.size()) + " elements for shape " +
                                          to_string(shape));
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
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
  const detail::ckpt::piece pieces[] = {{head.data(), head.size()}, {data.data(), data.size_bytes()}};
  detail::ckpt::write_atomically(path, pieces);
}

}  // namespace dtf
