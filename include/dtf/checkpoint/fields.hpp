// dtf/checkpoint/fields.hpp — the checks every number and name read from a checkpoint passes:
// closed sets (update rules), wrap-around-free arithmetic, names confined to the checkpoint
// directory, and typed access to JSON fields whose errors name the file and the field
// ("…/ckpt-5.manifest.json: variables[1].offset: …"). Shared by the manifest
// (checkpoint/format.hpp), the shard files (checkpoint/shard_header.hpp) and the table files
// (checkpoint/table_format.hpp). Errors: dtf::error with errc::corrupt_data.
#pragma once

#include <dtf/error.hpp>
#include <dtf/optim/rules.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace dtf {

/// One file of a checkpoint (a ps's shard file or table file) and its checksum.
struct checkpoint_file {
  std::string name;  ///< relative to the checkpoint directory (a plain file name)
  /// The ps that wrote the file.
  std::size_t ps = 0;
  /// The file's size.
  std::uint64_t bytes = 0;
  std::string sha256;  ///< 64 hex digits of the whole file
};

namespace detail::ckpt {

inline constexpr std::string_view manifest_format = "dtf-checkpoint-1";
inline constexpr std::size_t max_name_bytes = 255;         // one path component
inline constexpr std::size_t max_num_ps = 1 << 16;
inline constexpr std::size_t max_rank = 32;
inline constexpr std::uint64_t max_json_bytes = 1ull << 30;  // manifest and state file
inline constexpr std::uint64_t max_header_bytes = 1ull << 28;  // a shard file's JSON header
inline constexpr char shard_magic[8] = {'D', 'T', 'F', 'S', 'H', 'R', 'D', '1'};
inline constexpr std::size_t shard_prefix_bytes = 16;  // magic, header length

[[noreturn]] inline void corrupt(const std::string& what, const std::string& field, const std::string& problem) {
  throw error(errc::corrupt_data, what + ": " + (field.empty() ? "" : field + ": ") + problem);
}

inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return !__builtin_mul_overflow(a, b, &out);
}
inline bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return !__builtin_add_overflow(a, b, &out);
}

/// A name that may only denote a file directly inside the checkpoint directory.
inline bool confined_name(std::string_view n) noexcept {
  return !n.empty() && n.size() <= max_name_bytes && n != "." && n != ".." &&
         n.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}
inline void require_confined(const std::string& n, const std::string& what, const std::string& field) {
  if (!confined_name(n))
    corrupt(what, field, "'" + n.substr(0, 64) + "' is not a file name inside the checkpoint directory");
}

inline std::string shard_file_name(const std::string& name, std::size_t ps, std::size_t num_ps) {
  return name + ".ps-" + std::to_string(ps) + "-of-" + std::to_string(num_ps) + ".shard";
}
inline std::string manifest_file_name(const std::string& name) { return name + ".manifest.json"; }

/// Slots of the built-in update rule named `rule`, or -1 when no rule has that name.
inline int rule_slots(std::string_view rule) noexcept {
  int slots = -1;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((std::variant_alternative_t<I, optim::rule>::name == rule
          ? void(slots = int(std::variant_alternative_t<I, optim::rule>::num_slots))
          : void()),
     ...);
  }(std::make_index_sequence<std::variant_size_v<optim::rule>>{});
  return slots;
}
inline std::string rule_names() {
  std::string s;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((s += (I ? ", " : "") + std::string(std::variant_alternative_t<I, optim::rule>::name)), ...);
  }(std::make_index_sequence<std::variant_size_v<optim::rule>>{});
  return s;
}

// Typed access to JSON fields: every error names the file and the field's path.
inline const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& what,
                                   const std::string& path) {
  if (!j.is_object()) corrupt(what, path.empty() ? std::string("(top)") : path, "is not a JSON object");
  const auto it = j.find(key);
  const std::string here = path.empty() ? key : path + "." + key;
  if (it == j.end()) corrupt(what, here, "is missing");
  return *it;
}
inline std::string join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }
inline std::uint64_t as_u64(const nlohmann::json& v, const std::string& what, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return std::uint64_t(v.get<std::int64_t>());
  corrupt(what, path, "is not a non-negative integer");
}
inline std::int64_t as_i64(const nlohmann::json& v, const std::string& what, const std::string& path) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<std::int64_t>::max()))
    return std::int64_t(v.get<std::uint64_t>());
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
  corrupt(what, path, "is not a 64-bit integer");
}
inline std::uint64_t u64_at(const nlohmann::json& j, const char* key, const std::string& what, const std::string& path) {
  return as_u64(field(j, key, what, path), what, join(path, key));
}
inline std::uint64_t u64_at_most(const nlohmann::json& j, const char* key, std::uint64_t limit, const std::string& what,
                                 const std::string& path) {
  const auto v = u64_at(j, key, what, path);
  if (v > limit) corrupt(what, join(path, key), std::to_string(v) + " exceeds " + std::to_string(limit));
  return v;
}
inline std::int64_t count_at(const nlohmann::json& j, const char* key, const std::string& what,
                             const std::string& path) {
  const auto v = as_i64(field(j, key, what, path), what, join(path, key));
  if (v < 0) corrupt(what, join(path, key), "is negative (" + std::to_string(v) + ")");
  return v;
}
inline std::string string_at(const nlohmann::json& j, const char* key, const std::string& what,
                             const std::string& path, std::size_t max_bytes = 4096) {
  const auto& v = field(j, key, what, path);
  if (!v.is_string()) corrupt(what, join(path, key), "is not a string");
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > max_bytes) corrupt(what, join(path, key), "is longer than " + std::to_string(max_bytes) + " bytes");
  return s;
}
inline const nlohmann::json& array_at(const nlohmann::json& j, const char* key, const std::string& what,
                                      const std::string& path) {
  const auto& v = field(j, key, what, path);
  if (!v.is_array()) corrupt(what, join(path, key), "is not an array");
  return v;
}
inline std::string item(const char* array, std::size_t i) { return std::string(array) + "[" + std::to_string(i) + "]"; }

inline bool is_sha256_hex(const std::string& s) noexcept {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

/// An entry of a manifest's array of files (at `path`): a confined name not in `names` (added),
/// a ps below seen.size() that has no other file of the array (marked in seen), at least a
/// prefix's bytes, a SHA-256.
inline checkpoint_file parse_file_entry(const nlohmann::json& e, const std::string& what, const std::string& path,
                                        std::vector<bool>& seen, std::set<std::string>& names) {
  checkpoint_file f;
  f.name = string_at(e, "name", what, path);
  require_confined(f.name, what, path + ".name");
  if (!names.insert(f.name).second) corrupt(what, path + ".name", "'" + f.name + "' is named twice");
  f.ps = u64_at(e, "ps", what, path);
  if (f.ps >= seen.size() || seen[f.ps])
    corrupt(what, path + ".ps", "ps " + std::to_string(f.ps) + " is out of range or has two files");
  seen[f.ps] = true;
  f.bytes = u64_at(e, "bytes", what, path);
  if (f.bytes < shard_prefix_bytes) corrupt(what, path + ".bytes", std::to_string(f.bytes) + " bytes is too short");
  f.sha256 = string_at(e, "sha256", what, path, 64);
  if (!is_sha256_hex(f.sha256)) corrupt(what, path + ".sha256", "is not 64 lowercase hex digits");
  return f;
}

}  // namespace detail::ckpt

}  // namespace dtf
