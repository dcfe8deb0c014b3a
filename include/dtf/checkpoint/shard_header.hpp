// dtf/checkpoint/shard_header.hpp — a shard file's first bytes: magic, header length and the
// JSON header describing its entries, checked against the file's size and the manifest
// (layout in dtf/checkpoint.hpp). Errors: errc::corrupt_data naming the file and the field.
#pragma once

#include <dtf/checkpoint/format.hpp>
#include <dtf/checkpoint/input_file.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace dtf {

namespace detail::ckpt {

/// A shard file's parsed header and where its tensor bytes start.
struct shard_header {
  std::size_t ps = 0, num_ps = 0, num_slots = 0;
  std::int64_t global_step = 0;
  bool synchronous = false;  // written while the job's steps were held (absent: false)
  struct entry {
    std::uint32_t id;
    std::uint64_t size;
    std::int64_t iterations;
  };
  std::vector<entry> entries;
  std::uint64_t data_offset = 0;
};

/// Checks a shard file's first 16 bytes (magic, header length) against its size; returns the
/// header length.
/// (A table file starts the same way with its own magic: dtf/checkpoint/table_file.hpp.)
inline std::uint64_t parse_shard_prefix(const char (&prefix)[shard_prefix_bytes], std::uint64_t file_bytes,
                                        const std::string& what, const char (&magic)[8] = shard_magic,
                                        const char* kind = "shard") {
  if (file_bytes < shard_prefix_bytes || std::memcmp(prefix, magic, sizeof magic) != 0)
    corrupt(what, "", std::string("not a dtf ") + kind + " file (bad magic)");
  std::uint64_t len = 0;
  std::memcpy(&len, prefix + 8, sizeof len);
  if (len > file_bytes - shard_prefix_bytes || len > max_header_bytes)
    corrupt(what, "header length", std::to_string(len) + " bytes exceeds the file of " + std::to_string(file_bytes) +
                                       " bytes (or " + std::to_string(max_header_bytes) + ")");
  return len;
}

/// Checks `in` against the manifest's record of it (size, SHA-256) and its prefix (magic of a
/// `kind` file); returns its JSON header's text.
inline std::string verified_header_text(const input_file& in, const checkpoint_file& f,
                                        const char (&magic)[8] = shard_magic, const char* kind = "shard") {
  if (in.size() != f.bytes)
    corrupt(in.what(), "", std::to_string(in.size()) + " bytes, the manifest says " + std::to_string(f.bytes));
  const auto sum = in.sha256_hex();
  if (sum != f.sha256) corrupt(in.what(), "", "SHA-256 " + sum + " does not match the manifest's " + f.sha256);
  char prefix[shard_prefix_bytes];
  in.read(0, prefix, sizeof prefix);
  std::string text(std::size_t(parse_shard_prefix(prefix, in.size(), in.what(), magic, kind)), '\0');
  in.read(shard_prefix_bytes, text.data(), text.size());
  return text;
}

/// Parses a shard file's JSON header `text` (of a file of file_bytes bytes, for ps `ps` of a
/// manifest with num_ps tasks and num_slots slots) and checks that its entries, without
/// wrap-around, describe exactly the bytes after it.
inline shard_header parse_shard_header(std::string_view text, std::uint64_t file_bytes, std::size_t ps,
                                       std::size_t num_ps, std::size_t num_slots, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    corrupt(what, "header", std::string("malformed JSON: ") + e.what());
  }
  shard_header h;
  if (u64_at(j, "format", what, "header") != 1) corrupt(what, "header.format", "unknown shard format");
  h.ps = u64_at(j, "ps", what, "header");
  if (h.ps != ps) corrupt(what, "header.ps", "ps " + std::to_string(h.ps) + ", the manifest says ps " + std::to_string(ps));
  h.num_ps = u64_at(j, "num_ps", what, "header");
  if (h.num_ps != num_ps)
    corrupt(what, "header.num_ps", std::to_string(h.num_ps) + ", the manifest says " + std::to_string(num_ps));
  h.num_slots = u64_at_most(j, "num_slots", 2, what, "header");
  h.global_step = count_at(j, "global_step", what, "header");
  if (j.contains("synchronous")) {
    if (!j["synchronous"].is_boolean()) corrupt(what, "header.synchronous", "not a boolean");
    h.synchronous = j["synchronous"].get<bool>();
  }
  const auto& entries = array_at(j, "entries", what, "header");
  if (!entries.empty() && h.num_slots != num_slots)  // a ps holding no shard knows no rule
    corrupt(what, "header.num_slots", std::to_string(h.num_slots) + " slots, the manifest says " +
                                          std::to_string(num_slots));
  h.data_offset = shard_prefix_bytes + text.size();
  const std::uint64_t data_bytes = file_bytes - h.data_offset;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto path = "header." + item("entries", i);
    h.entries.push_back({std::uint32_t(u64_at_most(entries[i], "shard", std::numeric_limits<std::uint32_t>::max(),
                                                   what, path)),
                         u64_at(entries[i], "size", what, path), count_at(entries[i], "iterations", what, path)});
    std::uint64_t entry_bytes = 0;
    if (!checked_mul(h.entries.back().size, sizeof(float) * (1 + h.num_slots), entry_bytes) ||
        !checked_add(bytes, entry_bytes, bytes) || bytes > data_bytes)
      corrupt(what, path + ".size", std::to_string(h.entries.back().size) + " floats exceed the file's " +
                                        std::to_string(data_bytes) + " data bytes");
  }
  if (bytes != data_bytes)
    corrupt(what, "header.entries", std::to_string(file_bytes) + " bytes, the header describes " +
                                        std::to_string(h.data_offset + bytes));
  return h;
}

/// Checks a shard file's step against its checkpoint's, whatever the manifest says of the mode.
/// ps 0 holds the global step, so its file is of the checkpoint's step (the manifest takes
/// ps 0's); so is every file of a synchronous save (the manifest's flag or the file's own: its
/// steps were held while every ps wrote). Another ps of an asynchronous job keeps the step of
/// the job's last init or restore (only ps 0 counts steps there), which is never past ps 0's.
/// Errors: errc::corrupt_data naming the file and both steps.
inline void check_shard_step(const shard_header& h, const checkpoint_manifest& m, const std::string& what) {
  const bool of_the_step = h.ps == 0 || h.synchronous || m.synchronous;
  if (of_the_step ? h.global_step == m.global_step : h.global_step <= m.global_step) return;
  corrupt(what, "header.global_step",
          "the file of ps " + std::to_string(h.ps) + " holds step " + std::to_string(h.global_step) +
              ", the checkpoint's is " + std::to_string(m.global_step) +
              (of_the_step ? std::string(h.ps == 0 ? " (ps 0 holds the global step)" : " (a synchronous save is of one step)")
                           : std::string(" (a ps's step is never past ps 0's)")));
}

}  // namespace detail::ckpt
}  // namespace dtf
