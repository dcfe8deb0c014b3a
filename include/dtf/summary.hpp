// dtf/summary.hpp — TensorBoard event files: scalars and histograms, written without protobuf.
//
// A summary_writer creates `<logdir>/events.out.tfevents.<secs>.<host>` and appends records in
// TFRecord framing:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes
//   | length bytes of data        | uint32 masked CRC-32C of the data
// Each record's data is an `Event` protocol buffer (tensorflow/core/util/event.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; HistogramProto histo = 5; }
//   HistogramProto { double min = 1, max = 2, num = 3, sum = 4, sum_squares = 5;
//                    repeated double bucket_limit = 6 [packed]; repeated double bucket = 7 [packed]; }
// The first record is an Event with file_version "brain.Event:2", as TensorBoard expects.
// Scalars are Value.simple_value; histograms bucket the finite values into equal-width buckets
// between their min and max (bucket i counts values in (limit[i-1], limit[i]], the first
// bucket from min inclusive).
//
// Records reach the file with every flush() (and at destruction); TensorBoard reads a file
// while it grows. Thread safety: every member function may be called from several threads.
// Errors: dtf::error(errc::io_error) naming the path when the directory or file cannot be
// created or written.
#pragma once

#include <dtf/detail/crc32c.hpp>
#include <dtf/detail/proto_writer.hpp>
#include <dtf/error.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <unistd.h>

namespace dtf {

/// How a summary_writer buckets histograms and flushes.
struct summary_writer_options {
  std::size_t histogram_buckets = 30;  ///< equal-width buckets per histogram
  std::size_t flush_every_events = 0;  ///< flush after this many events (0: only on flush())
};

/// The statistics TensorBoard's HistogramProto holds.
struct histogram_summary {
  /// The values' minimum, maximum, count, sum and sum of squares.
  ///@{
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  ///@}
  /// The buckets' upper limits, and the number of values in each bucket.
  ///@{
  std::vector<double> bucket_limit, bucket;
  ///@}

  /// Buckets the finite values of `values` (NaN and infinities are left out) into `buckets`
  /// equal-width buckets between their min and max.
  static histogram_summary of(std::span<const float> values, std::size_t buckets = 30) {
    histogram_summary h;
    bool first = true;
    for (float f : values) {
      if (!std::isfinite(f)) continue;
      const double v = f;
      if (first) h.min = h.max = v, first = false;
      h.min = std::min(h.min, v);
      h.max = std::max(h.max, v);
      h.num += 1;
      h.sum += v;
      h.sum_squares += v * v;
    }
    if (h.num == 0) return h;
    const std::size_t n = h.max > h.min ? std::max<std::size_t>(1, buckets) : 1;
    const double width = (h.max - h.min) / double(n);
    h.bucket_limit.resize(n);
    h.bucket.assign(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) h.bucket_limit[i] = h.min + width * double(i + 1);
    h.bucket_limit[n - 1] = h.max;  // exact despite rounding
    for (float f : values) {
      if (!std::isfinite(f)) continue;
      // Bucket i holds (limit[i-1], limit[i]]; ceil-based index, clamped to the range.
      const double pos = width > 0 ? (double(f) - h.min) / width : 0.0;
      std::size_t i = pos <= 1.0 ? 0 : std::size_t(std::ceil(pos)) - 1;
      h.bucket[std::min(i, n - 1)] += 1;
    }
    return h;
  }
};

/// Writes one TensorBoard event file. See the file comment for the format.
class summary_writer {
 public:
  /// Creates `logdir` (and parents) and a new event file in it.
  explicit summary_writer(const std::filesystem::path& logdir, summary_writer_options options = {})
      : options_(options) {
    std::error_code ec;
    std::filesystem::create_directories(logdir, ec);
    if (ec) throw error(errc::io_error, "summary_writer: cannot create directory '" + logdir.string() + "': " + ec.message());
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "localhost");
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string base = "events.out.tfevents." + std::to_string(secs) + "." + host;
    // Two writers in one directory within a second (a restarted task) must not share a file:
    // create exclusively, adding a counter until the name is free.
    for (int k = 0; !file_; ++k) {
      path_ = logdir / (k == 0 ? base : base + "." + std::to_string(k));
      file_.reset(std::fopen(path_.c_str(), "wbx"));
      if (!file_ && (errno != EEXIST || k > 1000))
        throw error(errc::io_error, "summary_writer: cannot create '" + path_.string() + "': " + std::strerror(errno));
    }
    detail::proto_writer event;
    event.double_field(1, wall_time());
    event.int64_field(2, 0);
    event.string_field(3, "brain.Event:2");
    write_record(event.bytes());
    flush_locked();
  }

  summary_writer(const summary_writer&) = delete;
  summary_writer& operator=(const summary_writer&) = delete;
  ~summary_writer() {
    if (file_) std::fflush(file_.get());
  }

  /// One scalar (Value.simple_value) at `step`.
  void add_scalar(std::string_view tag, double value, std::int64_t step) {
    detail::proto_writer v;
    v.string_field(1, tag);
    v.float_field(2, float(value));
    detail::proto_writer summary;
    summary.message_field(1, v);
    write_event(summary, step);
  }

  /// Several scalars in one event at `step`.
  void add_scalars(const std::map<std::string, double>& values, std::int64_t step) {
    if (values.empty()) return;
    detail::proto_writer summary;
    for (const auto& [tag, value] : values) {
      detail::proto_writer v;
      v.string_field(1, tag);
      v.float_field(2, float(value));
      summary.message_field(1, v);
    }
    write_event(summary, step);
  }

  /// A histogram of `values` at `step` (buckets: options.histogram_buckets).
  void add_histogram(std::string_view tag, std::span<const float> values, std::int64_t step) {
    add_histogram(tag, histogram_summary::of(values, options_.histogram_buckets), step);
  }
  /// A histogram already bucketed, at `step`.
  void add_histogram(std::string_view tag, const histogram_summary& h, std::int64_t step) {
    detail::proto_writer histo;
    histo.double_field(1, h.min);
    histo.double_field(2, h.max);
    histo.double_field(3, h.num);
    histo.double_field(4, h.sum);
    histo.double_field(5, h.sum_squares);
    if (!h.bucket_limit.empty()) {
      histo.packed_doubles(6, h.bucket_limit);
      histo.packed_doubles(7, h.bucket);
    }
    detail::proto_writer v;
    v.string_field(1, tag);
    v.message_field(5, histo);
    detail::proto_writer summary;
    summary.message_field(1, v);
    write_event(summary, step);
  }

  /// Pushes buffered records to the file (fflush).
  void flush() {
    std::lock_guard lock(mutex_);
    flush_locked();
  }

  /// The event file's path.
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  struct file_closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };

  static double wall_time() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  void write_event(const detail::proto_writer& summary, std::int64_t step) {
    detail::proto_writer event;
    event.double_field(1, wall_time());
    event.int64_field(2, step);
    event.message_field(5, summary);
    std::lock_guard lock(mutex_);
    write_record(event.bytes());
    if (options_.flush_every_events && ++unflushed_ >= options_.flush_every_events) flush_locked();
  }

  void write_record(std::span<const std::byte> data) {
    std::byte header[12];
    const std::uint64_t n = data.size();
    for (int i = 0; i < 8; ++i) header[i] = std::byte((n >> (8 * i)) & 0xFF);
    put_u32(header + 8, detail::masked_crc32c(std::span<const std::byte>(header, 8)));
    std::byte footer[4];
    put_u32(footer, detail::masked_crc32c(data));
    if (std::fwrite(header, 1, sizeof header, file_.get()) != sizeof header ||
        std::fwrite(data.data(), 1, data.size(), file_.get()) != data.size() ||
        std::fwrite(footer, 1, sizeof footer, file_.get()) != sizeof footer)
      throw error(errc::io_error, "summary_writer: cannot write '" + path_.string() + "': " + std::strerror(errno));
  }

  static void put_u32(std::byte* at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) at[i] = std::byte((v >> (8 * i)) & 0xFF);
  }

  void flush_locked() {
    unflushed_ = 0;
    if (std::fflush(file_.get()) != 0)
      throw error(errc::io_error, "summary_writer: cannot flush '" + path_.string() + "': " + std::strerror(errno));
  }

  summary_writer_options options_;
  std::filesystem::path path_;
  std::unique_ptr<std::FILE, file_closer> file_;
  std::mutex mutex_;
  std::size_t unflushed_ = 0;
};

}  // namespace dtf
