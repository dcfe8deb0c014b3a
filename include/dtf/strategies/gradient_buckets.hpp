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
// After the first step (as PyTorch DDP rebuilds its buckets after its first iteration) a
// strategy may cut them again in the order that step reported its gradients (plan_in_order,
// reported_order): a model whose variables are laid out in another order than its backward's
// (a LibTorch module declared in another order than it uses its layers) then reduces its first
// gradients first. A bucket is a run of variables consecutive in that order and adjacent in the
// buffer (a scattered order makes smaller buckets, never a copy), at least bucket_bytes; the
// prefix goes with the bucket right after it when that one is reduced last (as plan_buckets
// cuts), else alone, last. For a model that reports from the top down this is plan_buckets' cut. The
// order must be every rank's: replan_after_first_step broadcasts rank 0's (ranks may observe
// different orders, e.g. a graph that depends on the data). Buckets are any disjoint ranges
// that cover the buffer, reduced in their list's order.
//
// bucket_reducer: a step is begin_step(reduce), then report(first, count) from backprop (any thread,
// each float of the gradient at most once per reporter; recorded while record_reports is on), then finish(): every bucket not yet
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
#include <span>
#include <string>
#include <string_view>
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

/// Floats in the buffer the buckets cover (the largest end).
inline std::size_t buffer_end(const std::vector<gradient_bucket>& buckets) {
  std::size_t total = 0;
  for (const auto& b : buckets) total = std::max(total, b.end);
  return total;
}

/// The buckets of plan_buckets' buffer cut in `order` (indices into vars, the order a step
/// reported their gradients, first first; see the file comment). Errors: errc::invalid_argument
/// when order is not a permutation of the variables.
inline std::vector<gradient_bucket> plan_in_order(const std::vector<variable_spec>& vars, std::size_t prefix,
                                                  std::size_t bucket_bytes, const std::vector<std::size_t>& order) {
  std::vector<char> seen(vars.size(), 0);
  for (std::size_t i : order)
    if (i >= vars.size() || seen[i]++)
      throw error(errc::invalid_argument, "plan_in_order: the order is not a permutation of the " +
                                              std::to_string(vars.size()) + " variables");
  if (order.size() != vars.size())
    throw error(errc::invalid_argument, "plan_in_order: the order has " + std::to_string(order.size()) +
                                            " variables, the model " + std::to_string(vars.size()));
  const std::size_t total = prefix + num_parameters(vars);
  if (bucket_bytes == 0 || total == prefix) return plan_buckets(vars, prefix, bucket_bytes);
  std::vector<std::size_t> starts;  // a variable's floats run to the next one's start (any gap its own)
  for (const auto& v : vars)
    if (v.size() > 0) starts.push_back(prefix + v.offset);
  std::sort(starts.begin(), starts.end());
  std::vector<gradient_bucket> buckets;
  gradient_bucket run;  // the bucket being grown (empty: none)
  for (std::size_t i : order) {
    if (vars[i].size() == 0) continue;
    const std::size_t at = prefix + vars[i].offset;
    const auto next = std::upper_bound(starts.begin(), starts.end(), at);
    const gradient_bucket v{at, next == starts.end() ? total : *next};
    if (run.size() > 0 && (v.end == run.begin || v.begin == run.end)) {
      run = {std::min(run.begin, v.begin), std::max(run.end, v.end)};
    } else {
      if (run.size() > 0) buckets.push_back(run);
      run = v;
    }
    if (run.size() * sizeof(float) >= bucket_bytes) {
      buckets.push_back(run);
      run = {};
    }
  }
  const bool open = run.size() > 0;  // the last bucket is what was left (under bucket_bytes)
  if (open) buckets.push_back(run);
  // The prefix and any gap before the first variable: with that variable's bucket when it is
  // last and what was left or right after the prefix (plan_buckets' rule), else alone, last.
  const std::size_t low = starts.front();
  if (!buckets.empty() && buckets.back().begin == low && (open || low == prefix)) buckets.back().begin = 0;
  else if (low > 0) buckets.push_back({0, low});
  return buckets;
}

/// The variables (indices into vars) in the order `reports` ([first, count) in buffer
/// coordinates, as a step made them) reached their first float; within one report from the top
/// down, and any never reported last, from the top down.
inline std::vector<std::size_t> reported_order(const std::vector<variable_spec>& vars, std::size_t prefix,
                                               const std::vector<std::pair<std::size_t, std::size_t>>& reports) {
  std::vector<std::size_t> by_start(vars.size());  // variables from the top of the buffer down
  for (std::size_t i = 0; i < vars.size(); ++i) by_start[i] = i;
  std::stable_sort(by_start.begin(), by_start.end(),
                   [&](std::size_t a, std::size_t b) { return vars[a].offset > vars[b].offset; });
  std::vector<std::size_t> order;
  std::vector<char> placed(vars.size(), 0);
  for (const auto& [first, count] : reports)
    for (std::size_t i : by_start) {
      const std::size_t start = prefix + vars[i].offset;
      if (!placed[i] && start >= first && start < first + count) {
        placed[i] = 1;
        order.push_back(i);
      }
    }
  for (std::size_t i : by_start)
    if (!placed[i]) order.push_back(i);
  return order;
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
    std::vector<gradient_bucket> sorted = buckets_;
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    for (std::size_t k = 0; k < sorted.size(); ++k)
      if (sorted[k].begin != (k == 0 ? 0 : sorted[k - 1].end) || sorted[k].size() == 0)
        throw error(errc::invalid_argument, "bucket_reducer: buckets must cover the buffer, each float once");
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

  /// From the next begin_step on, keep each step's reports ([first, count), in the order they
  /// came; off: keep none).
  void record_reports(bool on) {
    std::lock_guard lock(m_);
    recording_ = on;
  }
  /// The last step's reports, recorded as record_reports says (begin_step clears them).
  std::vector<std::pair<std::size_t, std::size_t>> reports() {
    std::lock_guard lock(m_);
    return reports_;
  }

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
    reports_.clear();
    ++generation_;
  }

  /// Floats [first, first + count) of one reporter's gradient are final (buffer coordinates).
  /// Errors: errc::invalid_argument for a range outside the buffer or reported twice.
  void report(std::size_t first, std::size_t count) {
    if (count == 0) return;
    const std::size_t total = buffer_end(buckets_);
    if (first > total || count > total - first)
      throw error(errc::invalid_argument, "gradient reported outside the buffer: floats [" + std::to_string(first) +
                                              ", " + std::to_string(first + count) + ") of " + std::to_string(total));
    bool wake = false;
    {
      std::lock_guard lock(m_);
      if (recording_) reports_.emplace_back(first, count);
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
  bool recording_ = false;
  std::vector<std::pair<std::size_t, std::size_t>> reports_;  // this step's, as they came (recording_)
  std::exception_ptr failure_;
  std::thread thread_;  // last: started once the rest exists
};

/// The buckets for the steps after the first (see the file comment): variables in the order
/// that step's reports reached them (r recorded them), rank 0's order broadcast over `comm` (a
/// dtf::communicator) as `name`, so that every rank cuts the same buckets.
template <class Comm>
std::vector<gradient_bucket> replan_after_first_step(Comm& comm, std::string_view name,
                                                     const std::vector<variable_spec>& vars, std::size_t prefix,
                                                     std::size_t bucket_bytes, bucket_reducer& r) {
  if (vars.size() >= (std::size_t(1) << 24))  // indices travel as floats, exact below 2^24
    throw error(errc::invalid_argument, "replan_after_first_step: too many variables (" +
                                            std::to_string(vars.size()) + ")");
  const auto order = reported_order(vars, prefix, r.reports());
  std::vector<float> sent(order.begin(), order.end());
  comm.broadcast(name, std::span<float>(sent), 0);
  std::vector<std::size_t> agreed(sent.size());
  for (std::size_t k = 0; k < sent.size(); ++k) agreed[k] = std::size_t(sent[k]);
  return plan_in_order(vars, prefix, bucket_bytes, agreed);
}

}  // namespace dtf::strategies::detail
