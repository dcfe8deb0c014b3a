// dtf/detail/staging_pipeline.hpp — moving a set of device-memory ranges through one host
// staging buffer in segments, so that the copy of one segment overlaps the socket transfer of
// another (CUDA builds: device memory → pinned memory while the previous segment is on the wire,
// and the reverse for replies).
//
// The staging buffer holds the ranges back to back (range i at the sum of the sizes before it),
// so segment k is the staging bytes [k·S, min((k+1)·S, total)) for segment size S, and a
// segment may cover parts of several ranges and a range several segments. The copies are
// issued by a copy engine (the Engine parameter), which is what differs between builds:
//   - cuda_copy_engine (dtf/detail/cuda_staging.hpp): cudaMemcpyAsync on a stream of its own,
//     one event per segment in flight, into memory from cudaHostAlloc;
//   - host_copy_engine (below): std::memcpy on the calling thread, for the tests of the
//     schedule on CPU builds (CPU builds' ps traffic is never staged: device memory is host
//     memory there and the socket reads and writes it in place).
//
// Schedule of a send (staged_send): begin() issues segment 0's copies and marks it; before the
// transport writes segment k, segment(k) issues segment k+1's copies, marks it and waits for
// segment k. So while segment k is written to the socket, segment k+1 is being copied; at most
// two segments are marked and not yet waited for. A receive (staged_receive): the transport
// reads segment k into segment(k), then received(k) issues its copies to device memory without
// waiting; finish() waits for all of them. The staging buffer covers the whole message, so no
// copy ever overwrites bytes the socket has not yet taken.
//
// Errors: the engine's (dtf::error); errc::internal when the transport breaks the order above.
// Thread safety: one thread per pipeline (and per engine).
#pragma once

#include <dtf/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace dtf::detail {

/// staging_copy_engine: issues copies between device memory and its own staging buffer.
///
/// Required expressions, for `E e`, `std::size_t n, k`, `std::byte* d`, `const std::byte* s`:
///   e.reserve(n) -> std::span<std::byte>  the staging buffer, at least n bytes (kept and
///                                          reused; may reallocate when n grows)
///   e.to_staging(d, s, n)                  issue a copy of n bytes from device s to staging d
///   e.from_staging(d, s, n)                issue a copy of n bytes from staging s to device d
///   e.mark(k)                              the copies issued so far complete segment k
///   e.wait(k)                              block until segment k's copies are done (k marked)
///   e.wait_all()                           block until every copy issued is done
/// A copy may still be running when the call returns (it is asynchronous on a GPU).
template <class E>
concept staging_copy_engine = requires(E& e, std::size_t n, std::byte* d, const std::byte* s) {
  { e.reserve(n) } -> std::same_as<std::span<std::byte>>;
  e.to_staging(d, s, n);
  e.from_staging(d, s, n);
  e.mark(n);
  e.wait(n);
  e.wait_all();
};

/// One device-memory range moved through the staging buffer: `bytes` bytes at `offset` bytes
/// from the pipeline's device base pointer.
struct staged_range {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

/// The segments of a message of `total` bytes cut every `segment_bytes`; the last one is short
/// when segment_bytes does not divide total; an empty message has none.
struct segment_plan {
  std::size_t total = 0;
  std::size_t segment_bytes = 1;

  std::size_t count() const noexcept { return total == 0 ? 0 : (total - 1) / segment_bytes + 1; }
  std::size_t begin(std::size_t k) const noexcept { return std::min(total, k * segment_bytes); }
  std::size_t end(std::size_t k) const noexcept { return std::min(total, (k + 1) * segment_bytes); }
};

/// Calls copy(range_index, device_offset, staging_offset, bytes) for each piece of the ranges
/// that falls inside staging bytes [begin, end) (ranges laid back to back), in order.
template <class F>
void for_each_piece(std::span<const staged_range> ranges, std::size_t begin, std::size_t end, F&& copy) {
  std::size_t at = 0;  // staging offset of range i
  for (std::size_t i = 0; i < ranges.size() && at < end; at += ranges[i].bytes, ++i) {
    const std::size_t lo = std::max(begin, at), hi = std::min(end, at + ranges[i].bytes);
    if (lo < hi) copy(i, ranges[i].offset + (lo - at), lo, hi - lo);
  }
}

inline std::size_t total_bytes(std::span<const staged_range> ranges) noexcept {
  std::size_t n = 0;
  for (const auto& r : ranges) n += r.bytes;
  return n;
}

inline void check_segment_bytes(std::size_t segment_bytes, const char* who) {
  if (segment_bytes == 0) throw error(errc::invalid_argument, std::string(who) + ": segment_bytes must be positive");
}

/// Device ranges → staging → socket, segment by segment (see the file comment).
template <staging_copy_engine Engine>
class staged_send {
 public:
  /// `device` is the base the ranges' offsets count from; the ranges must stay unchanged until
  /// the last segment has been taken.
  staged_send(Engine& engine, const std::byte* device, std::span<const staged_range> ranges, std::size_t segment_bytes)
      : engine_(engine), device_(device), ranges_(ranges.begin(), ranges.end()) {
    check_segment_bytes(segment_bytes, "staged_send");
    plan_ = {detail::total_bytes(ranges_), segment_bytes};
    staging_ = engine_.reserve(plan_.total).first(plan_.total);
  }

  std::size_t total_bytes() const noexcept { return plan_.total; }
  std::size_t count() const noexcept { return plan_.count(); }

  /// Issues segment 0's copies. Call once, before segment(0).
  void begin() {
    if (count() > 0) issue(0);
  }

  /// Segment k's staged bytes, ready to write (issues segment k+1's copies first). Call for
  /// k = 0, 1, … in order.
  std::span<const std::byte> segment(std::size_t k) {
    if (k != next_ || k >= issued_)
      throw error(errc::internal, "staged_send: segment " + std::to_string(k) + " requested out of order");
    if (k + 1 < count()) issue(k + 1);
    engine_.wait(k);
    ++next_;
    return std::span<const std::byte>(staging_).subspan(plan_.begin(k), plan_.end(k) - plan_.begin(k));
  }

 private:
  void issue(std::size_t k) {
    for_each_piece(ranges_, plan_.begin(k), plan_.end(k), [&](std::size_t, std::size_t dev, std::size_t at, std::size_t n) {
      engine_.to_staging(staging_.data() + at, device_ + dev, n);
    });
    engine_.mark(k);
    issued_ = k + 1;
  }

  Engine& engine_;
  const std::byte* device_;
  std::vector<staged_range> ranges_;
  segment_plan plan_;
  std::span<std::byte> staging_;
  std::size_t next_ = 0, issued_ = 0;
};

/// Socket → staging → device ranges, segment by segment (see the file comment).
template <staging_copy_engine Engine>
class staged_receive {
 public:
  staged_receive(Engine& engine, std::byte* device, std::span<const staged_range> ranges, std::size_t segment_bytes)
      : engine_(engine), device_(device), ranges_(ranges.begin(), ranges.end()) {
    check_segment_bytes(segment_bytes, "staged_receive");
    plan_ = {detail::total_bytes(ranges_), segment_bytes};
    staging_ = engine_.reserve(plan_.total).first(plan_.total);
  }

  std::size_t total_bytes() const noexcept { return plan_.total; }
  std::size_t count() const noexcept { return plan_.count(); }

  /// Where the transport reads segment k.
  std::span<std::byte> segment(std::size_t k) {
    if (k != next_ || k >= count())
      throw error(errc::internal, "staged_receive: segment " + std::to_string(k) + " requested out of order");
    return staging_.subspan(plan_.begin(k), plan_.end(k) - plan_.begin(k));
  }

  /// Segment k has been read: issues its copies to device memory (does not wait).
  void received(std::size_t k) {
    if (k != next_ || k >= count())
      throw error(errc::internal, "staged_receive: segment " + std::to_string(k) + " received out of order");
    for_each_piece(ranges_, plan_.begin(k), plan_.end(k), [&](std::size_t, std::size_t dev, std::size_t at, std::size_t n) {
      engine_.from_staging(device_ + dev, staging_.data() + at, n);
    });
    engine_.mark(k);
    ++next_;
  }

  /// Waits for every copy issued; afterwards the device ranges hold the message.
  /// Errors: errc::internal when not every segment was received.
  void finish() {
    engine_.wait_all();
    if (next_ != count())
      throw error(errc::internal, "staged_receive: " + std::to_string(next_) + " of " + std::to_string(count()) +
                                      " segments received");
  }

 private:
  Engine& engine_;
  std::byte* device_;
  std::vector<staged_range> ranges_;
  segment_plan plan_;
  std::span<std::byte> staging_;
  std::size_t next_ = 0;
};

/// The copy engine of tests on CPU builds: "device" memory is host memory and every copy is a
/// std::memcpy done when issued. It checks the pipeline's promises (a segment is waited for
/// only once marked; at most two segments of a send in flight) and can log what it was asked.
class host_copy_engine {
 public:
  struct op {
    enum kind_t { to_staging, from_staging, mark, wait, wait_all } kind;
    std::size_t value = 0;  ///< bytes of a copy, the segment of mark/wait
    bool operator==(const op&) const = default;
  };

  std::span<std::byte> reserve(std::size_t n) {
    if (storage_.size() < n) storage_.resize(n);
    marked_.clear();  // a new message: its segments count from 0
    return storage_;
  }
  void to_staging(std::byte* d, const std::byte* s, std::size_t n) { copy(op::to_staging, d, s, n); }
  void from_staging(std::byte* d, const std::byte* s, std::size_t n) { copy(op::from_staging, d, s, n); }
  void mark(std::size_t k) {
    marked_.push_back(k);
    log_.push_back({op::mark, k});
  }
  void wait(std::size_t k) {
    if (std::find(marked_.begin(), marked_.end(), k) == marked_.end())
      throw error(errc::internal, "host_copy_engine: wait for segment " + std::to_string(k) + " before its mark");
    // Marked, not yet waited for: k and at most the one after it.
    std::size_t pending = 0;
    for (auto m : marked_)
      if (m > k) ++pending;
    if (pending > 1) throw error(errc::internal, "host_copy_engine: more than two segments in flight");
    log_.push_back({op::wait, k});
  }
  void wait_all() { log_.push_back({op::wait_all, 0}); }

  /// Every call so far, in order.
  const std::vector<op>& log() const noexcept { return log_; }
  void clear_log() {
    log_.clear();
    marked_.clear();
  }
  std::span<const std::byte> staging() const noexcept { return storage_; }

 private:
  void copy(typename op::kind_t kind, std::byte* d, const std::byte* s, std::size_t n) {
    if (n > 0) std::memcpy(d, s, n);
    log_.push_back({kind, n});
  }

  std::vector<std::byte> storage_;
  std::vector<op> log_;
  std::vector<std::size_t> marked_;
};
static_assert(staging_copy_engine<host_copy_engine>,
              "host_copy_engine must model staging_copy_engine: reserve, to_staging, from_staging, mark, wait, wait_all");

}  // namespace dtf::detail
