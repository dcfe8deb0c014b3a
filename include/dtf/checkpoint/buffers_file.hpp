// dtf/checkpoint/buffers_file.hpp — a model's buffers (dtf::has_buffers: BatchNorm's running
// statistics and the like) beside a checkpoint: DIR/NAME.buffers, written by the chief (rank 0
// in a collective job) before the checkpoint's manifest, so that a committed checkpoint always
// has its buffers and a save that dies leaves debris that the next commit prunes (the file
// shares the checkpoint's "<prefix>-<step>." name, dtf/checkpoint/writer.hpp).
//
// Format: one line of JSON, then the floats (little-endian float32, the buffers one after another
// in the order of the header):
//   {"format":"dtf-buffers-1","buffers":[{"name":...,"shape":[...]},...],"floats":N,"sha256":"<hex of the floats>"}\n
// The file is independent of the number of ps tasks, so a restore into another number of ps
// (resharding) gives the buffers back as they were.
//
// Errors: errc::io_error when the file cannot be written or read; errc::corrupt_data naming the
// file and the field for a malformed header, a size that is not the header's, a checksum that
// does not match, or buffers that are not the model's (name or shape, the first that differs).
#pragma once

#include <dtf/checkpoint/fields.hpp>
#include <dtf/checkpoint/input_file.hpp>
#include <dtf/checkpoint/writer.hpp>
#include <dtf/detail/sha256.hpp>
#include <dtf/error.hpp>
#include <dtf/variable.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dtf {

/// The path of checkpoint `name`'s buffers file in `dir`.
inline std::filesystem::path buffers_file_path(const std::filesystem::path& dir, const std::string& name) {
  return dir / (name + ".buffers");
}

/// Writes `values` (laid out as `specs` say) as checkpoint `name`'s buffers file, crash-safely.
inline void write_buffers_file(const std::filesystem::path& dir, const std::string& name,
                               const std::vector<variable_spec>& specs, std::span<const float> values) {
  if (values.size() != num_parameters(specs))
    throw error(errc::invalid_argument, "write_buffers_file: " + std::to_string(values.size()) + " floats for buffers of " +
                                            std::to_string(num_parameters(specs)));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw error(errc::io_error, "cannot create checkpoint directory " + dir.string() + ": " + ec.message());
  std::vector<float> packed;
  nlohmann::json header{{"format", "dtf-buffers-1"}, {"buffers", nlohmann::json::array()}};
  for (const auto& s : specs) {
    header["buffers"].push_back({{"name", s.name}, {"shape", s.shape}});
    packed.insert(packed.end(), values.begin() + std::ptrdiff_t(s.offset),
                  values.begin() + std::ptrdiff_t(s.offset + s.size()));
  }
  detail::sha256 h;
  h.update(packed.data(), packed.size() * sizeof(float));
  header["floats"] = packed.size();
  header["sha256"] = h.hex();
  const std::string line = header.dump() + "\n";
  const detail::ckpt::piece pieces[] = {{line.data(), line.size()}, {packed.data(), packed.size() * sizeof(float)}};
  detail::ckpt::write_atomically(buffers_file_path(dir, name), pieces);
}

/// Reads checkpoint `name`'s buffers into `values` (laid out as `specs` say), checking that the
/// file holds exactly these buffers. Returns false when the checkpoint has no buffers file (one
/// saved by a model without buffers); errors as in the file comment.
inline bool read_buffers_file(const std::filesystem::path& dir, const std::string& name,
                              const std::vector<variable_spec>& specs, std::span<float> values) {
  const auto path = buffers_file_path(dir, name);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  const std::string what = "buffers file " + path.string();
  const auto file = detail::ckpt::input_file::open(path);
  const std::uint64_t size = file.size();
  // The header line: at most 64 bytes per buffer beyond its name and shape, bounded.
  std::uint64_t header_limit = 4096;
  for (const auto& s : specs) header_limit += 64 + s.name.size() + 24 * s.shape.size();
  std::string line(std::size_t(std::min(size, header_limit)), '\0');
  file.read(0, line.data(), line.size());
  const auto newline = line.find('\n');
  if (newline == std::string::npos) detail::ckpt::corrupt(what, "header", "no header line within its bound");
  line.resize(newline);
  const nlohmann::json h = detail::ckpt::parse_json(line, what);
  if (!h.is_object() || h.value("format", std::string()) != "dtf-buffers-1")
    detail::ckpt::corrupt(what, "format", "is not \"dtf-buffers-1\"");
  if (!h.contains("buffers") || !h["buffers"].is_array()) detail::ckpt::corrupt(what, "buffers", "is not an array");
  const auto& saved = h["buffers"];
  if (saved.size() != specs.size())
    detail::ckpt::corrupt(what, "buffers", "holds " + std::to_string(saved.size()) + " buffers, the model has " +
                                               std::to_string(specs.size()));
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& e = saved[i];
    const std::string at = "buffers[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array())
      detail::ckpt::corrupt(what, at, "is not {name, shape}");
    dims shape;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) detail::ckpt::corrupt(what, at + ".shape", "is not a list of sizes");
      shape.push_back(d.get<std::size_t>());
    }
    if (e["name"].get<std::string>() != specs[i].name || shape != specs[i].shape)
      detail::ckpt::corrupt(what, at, "is '" + e["name"].get<std::string>().substr(0, 128) + "' " + to_string(shape) +
                                          ", the model's is '" + specs[i].name + "' " + to_string(specs[i].shape));
  }
  const std::size_t floats = num_parameters(specs);
  if (!h.contains("floats") || !h["floats"].is_number_unsigned() || h["floats"].get<std::uint64_t>() != floats)
    detail::ckpt::corrupt(what, "floats", "is not " + std::to_string(floats));
  if (!h.contains("sha256") || !h["sha256"].is_string() || !detail::ckpt::is_sha256_hex(h["sha256"].get<std::string>()))
    detail::ckpt::corrupt(what, "sha256", "is not 64 lowercase hex digits");
  if (size != newline + 1 + floats * sizeof(float))
    detail::ckpt::corrupt(what, "", "is " + std::to_string(size) + " bytes, its header says " +
                                        std::to_string(newline + 1 + floats * sizeof(float)));
  std::vector<float> packed(floats);
  file.read(newline + 1, packed.data(), floats * sizeof(float));
  detail::sha256 sum;
  sum.update(packed.data(), packed.size() * sizeof(float));
  if (sum.hex() != h["sha256"].get<std::string>()) detail::ckpt::corrupt(what, "sha256", "does not match the floats");
  if (values.size() != floats)
    throw error(errc::invalid_argument, "read_buffers_file: " + std::to_string(values.size()) + " floats for buffers of " +
                                            std::to_string(floats));
  std::size_t at = 0;
  for (const auto& s : specs) {
    std::copy_n(packed.begin() + std::ptrdiff_t(at), s.size(), values.begin() + std::ptrdiff_t(s.offset));
    at += s.size();
  }
  return true;
}

}  // namespace dtf
