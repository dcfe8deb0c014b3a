// dtf/strategies/gradient_buckets.hpp — overlap of gradient communication with backprop for
// the collective strategies (ring_allreduce, mirrored): the exchange buffer cut into buckets
// in the order backprop finishes them, and a communication thread that reduces each bucket as
// soon as every gradient in it has been reported, while backprop goes on below it.
//
// The exchange buffer of a strategy is [prefix slots][the model's gradient, n floats]: slot 0
// carries the loss (known only once backprop returns), the other prefix slots are zero and keep
// the gradient 64-byte aligned. Buckets are cut at variable boundaries, from the last variable
// (the top layer, whose gradient backprop writes first) down, each at least bucket_bytes (the
// last one, which holds the prefix, takes what is left): bucket 0 ends at the buffer's end,
// the last bucket starts at 0. Every rank cuts the same buckets from the same variables, and
// the buckets are always reduced in this order, one collective each, whether or not the
// reduction overlaps backprop: the results are bitwise identical with overlap on and off.
//
// bucket_reducer: a step is begin_step(reduce), then report(first, count) from backprop (any thread,
// each float of the gradient at most once per reporter), then finish(): every bucket not yet
// reported is ready, and finish() returns when all are reduced (it rethrows the first error
// of the reduction). With a communication thread (overlap) a bucket is reduced as soon as all
// its floats have been reported by every reporter; without one finish() reduces them all on
// the caller's thread. A step whose backprop fails calls abort_step(): it waits for the
// bucket in flight (bounded by the collective's timeout) and reduces nothing more.
//
// Thread safety: report() may be called from several threads at once (mirrored's replicas);
// begin_step/finish/abort_step from one thread.
#pragma once

#include <dtf/error.hpp>
#include <dtf/variable.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtf::strategies::detail {

/// Floats ahead of the gradient in a collective strategy's exchange buffer (slot 0: the loss).
inline constexpr std::size_t exchange_prefix = 16;

/// [begin, end) floats of the exchange buffer.
struct gradient_bucket {
  std::size_t begin = 0, end = 0;
  std::size_t size() const noexcept { return end - begin; }
  friend bool operator==(const gradient_bucket&, const gradient_bucket&) = default;
};

/// The buckets of an exchange buffer of prefix + num_parameters(vars) floats, in the order
/// backprop completes them (see the file comment). bucket_bytes 0: one bucket, the whole buffer.
inline std::vector<gradient_bucket> plan_buckets(const std::vector<variable_spec>& vars, std::size_t prefix,
                                                 std::size_t bucket_bytes) {
  const std::size_t total = prefix + num_parameters(vars);
  std::vector<std::size_t> starts;  // where variables begin, in buffer coordinates
  for (const auto& v : vars)
    if (v.size() > 0) starts.push_back(prefix + v.offset);
  std::sort(starts.begin(), starts.end(), std::greater<>());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<gradient_bucket> buckets;
  std::size_t end = total;
  if (bucket_bytes > 0)
    for (std::size_t s : starts) {
      if (s == 0 || s <= prefix) break;  // the first variable's bucket takes the prefix with it
      if ((end - s) * sizeof(float) >= bucket_bytes) {
        buckets.push_back({s, end});
        end = s;
      }
    }
  if (end > 0) buckets.push_back({0, end});
  return buckets;
}

/// Reduces a step's buckets in order, on a communication thread (overlap) or on the caller's.
class bucket_reducer {
 public:
  using reduce_fn = std::function<void(std::size_t, const gradient_bucket&)>;

  /// `overlap`: reduce on a communication thread of its own as buckets complete.
  /// `reporters`: how many copies of the gradient report each float (mirrored: its replicas).
  /// `thread_init`: run first on the communication thread (e.g. its CUDA device).
  bucket_reducer(std::vector<gradient_bucket> buckets, bool overlap, std::size_t reporters = 1,
                 std::function<void()> thread_init = {})
      : buckets_(std::move(buckets)), reporters_(reporters), remaining_(buckets_.size()) {
    for (std::size_t k = 1; k < buckets_.size(); ++k)
      if (buckets_[k].end != buckets_[k - 1].begin)
        throw error(errc::invalid_argument, "bucket_reducer: buckets must tile the buffer from its end down");
    if (overlap)
      thread_ = std::thread([this, init = std::move(thread_init)] {
        if (init) init();
        run();
      });
  }
  bucket_reducer(const bucket_reducer&) = delete;
  bucket_reducer& operator=(const bucket_reducer&) = delete;
  ~bucket_reducer() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(m_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  bool overlapping() const noexcept { return thread_.joinable(); }
  const std::vector<gradient_bucket>& buckets() const noexcept { return buckets_; }

  /// A new step, whose buckets reduce(k, bucket) reduces (called in order k = 0, 1, ..., once
  /// each): nothing reported, nothing reduced.
  void begin_step(reduce_fn reduce) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return !active_; });  // the last step's loop has ended
    reduce_ = std::move(reduce);
    for (std::size_t k = 0; k < buckets_.size(); ++k) remaining_[k] = reporters_ * buckets_[k].size();
    ready_ = 0;
    reduced_ = 0;
    stop_ = false;
    failure_ = nullptr;
    ++generation_;
  }

  /// Floats [first, first + count) of one reporter's gradient are final (buffer coordinates).
  /// Errors: errc::invalid_argument for a range outside the buffer or reported twice.
  void report(std::size_t first, std::size_t count) {
    if (count == 0) return;
    const std::size_t total = buckets_.empty() ? 0 : buckets_.front().end;
    if (first > total || count > total - first)
      throw error(errc::invalid_argument, "gradient reported outside the buffer: floats [" + std::to_string(first) +
                                              ", " + std::to_string(first + count) + ") of " + std::to_string(total));
    bool wake = false;
    {
      std::lock_guard lock(m_);
      // Buckets run from the end of the buffer down: the one holding `first` and those above.
      for (std::size_t k = 0; k < buckets_.size(); ++k) {
        const gradient_bucket& b = buckets_[k];
        const std::size_t lo = std::max(first, b.begin), hi = std::min(first + count, b.end);
        if (lo >= hi) continue;
        if (remaining_[k] < hi - lo)
          throw error(errc::invalid_argument, "gradient floats [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                                  ") reported more often than there are reporters");
        remaining_[k] -= hi - lo;
      }
      while (ready_ < buckets_.size() && remaining_[ready_] == 0) {
        ++ready_;
        wake = true;
      }
    }
    if (wake && overlapping()) cv_.notify_all();
  }

  /// Every bucket is ready (backprop is over); returns when all are reduced. Rethrows the
  /// reduction's first error.
  void finish() {
    if (!overlapping()) {
      for (std::size_t k = 0; k < buckets_.size(); ++k) reduce_(k, buckets_[k]);
      return;
    }
    std::unique_lock lock(m_);
    ready_ = buckets_.size();
    cv_.notify_all();
    cv_.wait(lock, [&] { return reduced_ == buckets_.size() || failure_; });
    if (failure_) std::rethrow_exception(failure_);
  }

  /// Backprop failed: reduce nothing more; returns once no bucket is in flight.
  void abort_step() noexcept {
    if (!overlapping()) return;
    std::unique_lock lock(m_);
    stop_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !active_; });
  }

 private:
  // The communication thread: one pass over the buckets per step, each as soon as it is ready;
  // a pass ends when every bucket is reduced, one failed, or the step was aborted.
  void run() {
    std::unique_lock lock(m_);
    std::uint64_t seen = 0;
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || generation_ != seen; });
      if (quit_) return;
      seen = generation_;
      active_ = true;
      for (std::size_t k = 0; k < buckets_.size(); ++k) {
        cv_.wait(lock, [&] { return quit_ || stop_ || ready_ > k; });
        if (quit_ || stop_) break;
        lock.unlock();
        std::exception_ptr failed;
        try {
          reduce_(k, buckets_[k]);
        } catch (...) {
          failed = std::current_exception();
        }
        lock.lock();
        if (failed) {
          failure_ = failed;
          break;
        }
        ++reduced_;
      }
      active_ = false;
      cv_.notify_all();
      if (quit_) return;
    }
  }

  std::vector<gradient_bucket> buckets_;
  reduce_fn reduce_;  // this step's
  std::size_t reporters_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::size_t> remaining_;  // floats of bucket k not yet reported (all reporters)
  std::size_t ready_ = 0;               // buckets 0..ready_-1 are fully reported
  std::size_t reduced_ = 0;             // buckets reduced this step
  std::uint64_t generation_ = 0;        // steps begun
  bool stop_ = false;    // this step was aborted
  bool active_ = false;  // the thread is in a step's pass over the buckets
  bool quit_ = false;
  std::exception_ptr failure_;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace dtf::strategies::detail
