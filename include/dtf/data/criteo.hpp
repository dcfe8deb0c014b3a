// dtf/data/criteo.hpp — reader for the Criteo display-ads logs (the Kaggle / Terabyte TSV
// format), plain or gzip-compressed, into columns an embedding model can use.
//
// Format: one example per line, 40 tab-separated fields: the label (0 or 1), 13 integer
// features I1..I13 (possibly negative), 26 categorical features C1..C26 (hexadecimal strings,
// the hashed values Criteo published). Any feature may be empty (missing); the label may not.
// A line may end in "\r\n"; the last line may lack its newline. Columns are numbered from 1 in
// errors: column 1 is the label, 2..14 are I1..I13, 15..40 are C1..C26.
//
// Output (criteo_columns), per example:
//   label       0.0f or 1.0f
//   dense[13]   criteo_dense_value(x): log(1 + x) for x > 0, else 0 (negative values, which
//               Criteo uses as codes, and missing fields are 0). The log tames the heavy tails
//               (counts up to millions) so a dense tower needs no further normalisation.
//   ids[26]     criteo_id(column, text): a 64-bit hash of the field's text salted by the column
//               (the same string in two columns is two ids), never 0; a missing field is
//               criteo_missing_id (0), so a model can give "missing" a row of its own.
//
// Errors (dtf::error naming the file): errc::io_error when the file cannot be opened;
// errc::corrupt_data for a corrupt gzip stream or a malformed line: the message names the line
// (from 1) and the column: a wrong number of fields, a label that is not 0 or 1, a field of an
// integer column that is not a 64-bit integer, a categorical field that is not 1 to 16 hex
// digits, a line longer than criteo_options::max_line_bytes. With skip_malformed such a line
// is skipped and counted instead (criteo_columns::skipped, and the first skipped line's
// message is kept for the caller to print).
//
// Bounds: a line is held in a buffer of at most max_line_bytes (default 64 KiB; Criteo's
// lines are under 1 KiB); a longer one is refused (or skipped to its newline without being
// held). The columns grow by 160 bytes per example kept; max_examples caps them.
#pragma once

#include <dtf/data/idx.hpp>
#include <dtf/error.hpp>

#include <zlib.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtf::data {

/// Integer (dense) columns of a Criteo line.
inline constexpr std::size_t criteo_dense_columns = 13;
/// Categorical columns of a Criteo line.
inline constexpr std::size_t criteo_categorical_columns = 26;
/// Fields of a Criteo line: the label, the integer columns, the categorical ones.
inline constexpr std::size_t criteo_fields = 1 + criteo_dense_columns + criteo_categorical_columns;
/// The id of a missing categorical field (criteo_id never returns it).
inline constexpr std::uint64_t criteo_missing_id = 0;

/// How read_criteo treats its input.
struct criteo_options {
  /// Skip and count malformed lines instead of throwing on the first.
  bool skip_malformed = false;
  /// The longest line accepted, in bytes, without its newline.
  std::size_t max_line_bytes = std::size_t(64) << 10;
  /// Stop after this many examples kept (0: the whole file).
  std::size_t max_examples = 0;
};

/// Examples in columns: example i's label is labels[i], its dense features
/// dense[i * 13 .. i * 13 + 13), its ids ids[i * 26 .. i * 26 + 26).
struct criteo_columns {
  std::vector<float> labels;       ///< [examples]: 0 or 1
  std::vector<float> dense;        ///< [examples, 13], row-major
  std::vector<std::uint64_t> ids;  ///< [examples, 26], row-major
  /// Malformed lines skipped (skip_malformed).
  std::size_t skipped = 0;
  /// The first skipped line's error message (empty when none was skipped).
  std::string first_skipped;
  /// The number of examples.
  std::size_t size() const noexcept { return labels.size(); }
};

/// The dense feature stored for integer value x: log(1 + x) for x > 0, else 0.
inline float criteo_dense_value(std::int64_t x) noexcept {
  return x > 0 ? static_cast<float>(std::log1p(static_cast<double>(x))) : 0.0f;
}

/// The id of categorical text `text` in categorical column `column` (0-based, C1 is 0): FNV-1a
/// over the column and the text, finished by a 64-bit mixer; never criteo_missing_id.
inline std::uint64_t criteo_id(std::size_t column, std::string_view text) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto add = [&h](unsigned char c) {
    h ^= c;
    h *= 0x100000001b3ull;
  };
  add(static_cast<unsigned char>(column));
  add(0xff);  // separates the column from the text
  for (char c : text) add(static_cast<unsigned char>(c));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h == criteo_missing_id ? 1 : h;
}

/// The name of field `field` (0-based) of a line: "label", "I1".."I13", "C1".."C26".
inline std::string criteo_field_name(std::size_t field) {
  if (field == 0) return "label";
  if (field <= criteo_dense_columns) return "I" + std::to_string(field);
  return "C" + std::to_string(field - criteo_dense_columns);
}

namespace detail {

/// A printable excerpt of a bad field (at most 24 bytes, non-printable bytes as \xNN).
inline std::string criteo_excerpt(std::string_view s) {
  std::string out;
  const std::size_t n = s.size() < 24 ? s.size() : 24;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > n) out += "...";
  return out;
}

/// One parsed line, or the reason it is malformed (field: 0-based, or -1 for the whole line).
struct criteo_line {
  float label = 0;
  std::array<float, criteo_dense_columns> dense{};
  std::array<std::uint64_t, criteo_categorical_columns> ids{};
  std::string problem;
  int field = -1;
};

inline bool is_hex_digit(char c) noexcept {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/// Parses one line (without its newline); sets out.problem when it is malformed.
inline void parse_criteo_line(std::string_view line, criteo_line& out) {
  out.problem.clear();
  out.field = -1;
  std::array<std::string_view, criteo_fields> f;
  std::size_t count = 0, start = 0;
  for (std::size_t i = 0; i <= line.size(); ++i) {
    if (i < line.size() && line[i] != '\t') continue;
    if (count < criteo_fields) f[count] = line.substr(start, i - start);
    ++count;
    start = i + 1;
  }
  if (count != criteo_fields) {
    out.problem = std::to_string(count) + " tab-separated fields, expected " + std::to_string(criteo_fields) +
                  " (label, 13 integer, 26 categorical)";
    out.field = count < criteo_fields ? int(count) : int(criteo_fields);
    return;
  }
  auto bad = [&](std::size_t field, const std::string& why) {
    out.field = int(field);
    out.problem = why + ": '" + criteo_excerpt(f[field]) + "'";
  };
  if (f[0] == "0") out.label = 0.0f;
  else if (f[0] == "1") out.label = 1.0f;
  else return bad(0, "the label is not 0 or 1");
  for (std::size_t c = 0; c < criteo_dense_columns; ++c) {
    const std::string_view s = f[1 + c];
    if (s.empty()) {
      out.dense[c] = 0.0f;
      continue;
    }
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc::result_out_of_range) return bad(1 + c, "an integer outside 64 bits");
    if (ec != std::errc() || end != s.data() + s.size()) return bad(1 + c, "not an integer");
    out.dense[c] = criteo_dense_value(v);
  }
  for (std::size_t c = 0; c < criteo_categorical_columns; ++c) {
    const std::string_view s = f[1 + criteo_dense_columns + c];
    if (s.empty()) {
      out.ids[c] = criteo_missing_id;
      continue;
    }
    if (s.size() > 16) return bad(1 + criteo_dense_columns + c, "a categorical value longer than 16 hex digits");
    for (char ch : s)
      if (!is_hex_digit(ch)) return bad(1 + criteo_dense_columns + c, "not a hexadecimal categorical value");
    out.ids[c] = criteo_id(c, s);
  }
}

}  // namespace detail

/// Reads a Criteo TSV file (plain or gzip, detected from the content) line by line into
/// columns. One reader serves one thread.
class criteo_reader {
 public:
  /// Opens `path`; errc::io_error when it cannot be opened.
  explicit criteo_reader(std::string path, criteo_options o = {}) : path_(std::move(path)), o_(o) {
    if (o_.max_line_bytes == 0) throw error(errc::invalid_argument, path_ + ": criteo_options::max_line_bytes is 0");
    f_.reset(gzopen(path_.c_str(), "rb"));
    if (!f_) throw error(errc::io_error, path_ + ": cannot open Criteo TSV file (" + std::strerror(errno) + ")");
    gzbuffer(f_.get(), 1 << 17);
    chunk_.resize(std::size_t(1) << 16);
  }

  /// Appends up to `max` examples (0: all that remain) to `out`; returns how many it appended
  /// (0 at the end of the file). Skipped lines are added to out.skipped.
  std::size_t read(criteo_columns& out, std::size_t max = 0) {
    std::size_t added = 0;
    std::string_view line;
    while ((max == 0 || added < max) && next_line(line)) {
      if (too_long_) {
        malformed(out, "line " + std::to_string(line_no_) + ": longer than " + std::to_string(o_.max_line_bytes) +
                           " bytes (criteo_options::max_line_bytes)");
        continue;
      }
      detail::parse_criteo_line(line, parsed_);
      if (!parsed_.problem.empty()) {
        malformed(out, "line " + std::to_string(line_no_) + ", column " + std::to_string(parsed_.field + 1) + " (" +
                           (parsed_.field < int(criteo_fields) ? criteo_field_name(std::size_t(parsed_.field))
                                                               : std::string("past C26")) +
                           "): " + parsed_.problem);
        continue;
      }
      out.labels.push_back(parsed_.label);
      out.dense.insert(out.dense.end(), parsed_.dense.begin(), parsed_.dense.end());
      out.ids.insert(out.ids.end(), parsed_.ids.begin(), parsed_.ids.end());
      ++added;
    }
    return added;
  }

  /// Lines read so far (kept or skipped).
  std::size_t lines() const noexcept { return line_no_; }

 private:
  void malformed(criteo_columns& out, const std::string& what) {
    const std::string msg = path_ + ": " + what;
    if (!o_.skip_malformed) throw error(errc::corrupt_data, msg);
    if (out.skipped++ == 0) out.first_skipped = msg;
  }

  // Refills chunk_; false at the end of the file.
  bool refill() {
    const int got = gzread(f_.get(), chunk_.data(), unsigned(chunk_.size()));
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f_.get(), &code);
      throw error(errc::corrupt_data, path_ + ": corrupt gzip stream after line " + std::to_string(line_no_) + " (" +
                                          msg + ")");
    }
    pos_ = 0;
    end_ = std::size_t(got);
    return got > 0;
  }

  // The next line without its newline (and a final '\r'); too_long_ says it was over the cap
  // (then its bytes were dropped, not held).
  bool next_line(std::string_view& line) {
    line_.clear();
    too_long_ = false;
    bool any = false;
    for (;;) {
      if (pos_ == end_ && !refill()) {
        if (!any) return false;
        break;
      }
      any = true;
      const char* begin = chunk_.data() + pos_;
      const auto* nl = static_cast<const char*>(std::memchr(begin, '\n', end_ - pos_));
      const std::size_t n = nl ? std::size_t(nl - begin) : end_ - pos_;
      // +1: room for a '\r' before the newline, stripped below.
      if (!too_long_ && line_.size() + n <= o_.max_line_bytes + 1) line_.append(begin, n);
      else too_long_ = true;
      pos_ += n + (nl ? 1 : 0);
      if (nl) break;
    }
    ++line_no_;
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (line_.size() > o_.max_line_bytes) too_long_ = true;
    if (too_long_) line_.clear();
    line = line_;
    return true;
  }

  std::string path_;
  criteo_options o_;
  std::unique_ptr<gzFile_s, detail::gz_closer> f_;
  std::vector<char> chunk_;
  std::size_t pos_ = 0, end_ = 0, line_no_ = 0;
  std::string line_;
  bool too_long_ = false;
  detail::criteo_line parsed_;
};

/// Reads a whole Criteo TSV file (up to o.max_examples examples) into columns.
inline criteo_columns read_criteo(const std::string& path, const criteo_options& o = {}) {
  criteo_reader r(path, o);
  criteo_columns out;
  r.read(out, o.max_examples);
  return out;
}

}  // namespace dtf::data
