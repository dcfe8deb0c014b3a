// dtf/device/loss_ring.hpp — the step's loss read by the host at the hooks' cadence, never per
// step, and a device flag raised by the first non-finite loss (docs/design/gpu-execution.md,
// section 5).
//
//   dtf::device::loss_ring ring(std::max(log_every, summary_every));
//   ... each step: net.loss_and_gradients(...) leaves the mean loss at net.device_loss() ...
//   ring.push(step, net.device_loss(), stream);          // no host wait (unless the ring is full)
//   for (auto [s, loss] : ring.poll()) log(s, loss);     // the steps whose copies have landed
//   if (auto bad = ring.first_nonfinite()) stop(*bad);   // the first NaN/inf step seen so far
//
// CUDA builds: `slots` pinned host slots (cudaHostAlloc). push() issues on `stream`, in order:
// a one-thread kernel that sets the device flag to step + 1 if the flag is still 0 and the loss
// is NaN or infinite (stream order, not atomics: the first bad step in stream order wins); an
// asynchronous copy of the loss and of the flag into the next slot; an event. poll() returns,
// oldest first, the slots whose events have completed (cudaEventQuery: it never waits). When all
// slots are in flight, push() first waits for the oldest (the only host wait, and only when the
// reader falls `slots` steps behind) and keeps its entry for the next poll().
// CPU builds: the same type; the copies are immediate (the loss is in host memory), so poll()
// returns every step pushed since the last poll.
// set_wait_check(check): the ring's host waits (push()'s on a full ring, drain()) poll the slot's
// event (cudaEventQuery) and call check(since) in the loop instead of blocking in
// cudaEventSynchronize, so a wait on a device stuck behind a dead peer's collective ends with
// check's error (ring_allreduce::watch_losses installs its NCCL exchange's health check,
// docs/design/gpu-execution.md section 6.1); check is called at least once per wait on every
// build (CPU builds: once, nothing to wait for).
// device_flag() is what update kernels read to apply nothing from the bad step on
// (optim::optimizer::set_skip_flag; ring_allreduce::watch_losses pushes before its update, so the
// bad step's own update is skipped too).
// Errors: errc::invalid_argument for a ring of 0 slots; errc::internal naming the CUDA call that
// failed. Thread safety: none; one thread pushes and polls.
#pragma once

#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::device {

/// A step's loss as the host reads it.
struct step_loss {
  std::int64_t step = 0;  ///< the step the loss belongs to, as pushed
  float loss = 0.0f;      ///< the mean loss of that step
  /// Equal step and loss.
  friend bool operator==(const step_loss&, const step_loss&) = default;
};

namespace detail {
// One thread: the flag takes step + 1 at the first loss that is NaN or infinite.
struct raise_nonfinite {
  const float* loss;
  std::int64_t* flag;
  std::int64_t step;
  DTF_HD void operator()(std::size_t) const {
    const float v = *loss;
    if (*flag == 0 && !(fabsf(v) <= std::numeric_limits<float>::max())) *flag = step + 1;
  }
};

// What one slot receives: the loss and the flag as they were after that step.
struct loss_slot {
  float loss;
  std::int64_t flag;
};

#if DTF_CUDA
inline void check_ring(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw error(errc::internal, std::string("device::loss_ring: ") + what + ": " + cudaGetErrorString(rc));
}
#endif
}  // namespace detail

/// A ring of the steps' losses read at the host's cadence, and the non-finite flag (see the file
/// comment).
class loss_ring {
 public:
  /// A ring of `slots` entries on the current device. Errors: errc::invalid_argument for 0 slots.
  explicit loss_ring(std::size_t slots) : steps_(slots) {
    if (slots == 0) throw error(errc::invalid_argument, "device::loss_ring: a ring needs at least one slot");
#if DTF_CUDA
    events_.assign(slots, nullptr);
    try {
      void* p = nullptr;
      detail::check_ring(cudaHostAlloc(&p, slots * sizeof(detail::loss_slot), cudaHostAllocDefault), "cudaHostAlloc");
      slots_ = static_cast<detail::loss_slot*>(p);
      detail::check_ring(cudaMalloc(&flag_, sizeof(std::int64_t)), "cudaMalloc (flag)");
      detail::check_ring(cudaMemset(flag_, 0, sizeof(std::int64_t)), "cudaMemset (flag)");
      for (auto& e : events_) detail::check_ring(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    } catch (...) {
      release();
      throw;
    }
#else
    slots_.resize(slots);
#endif
  }
  loss_ring(const loss_ring&) = delete;
  loss_ring& operator=(const loss_ring&) = delete;
  ~loss_ring() { release(); }

  /// The number of slots.
  std::size_t capacity() const noexcept { return steps_.size(); }

  /// What each host wait calls in its loop, with the wait's start; it ends the wait by throwing.
  using wait_check = std::function<void(std::chrono::steady_clock::time_point since)>;
  /// The check of later waits (see the file comment); empty: none (the waits block).
  void set_wait_check(wait_check check) { check_ = std::move(check); }

  /// Records step's loss, the float at `device_loss` (device memory; host memory on CPU builds)
  /// once the work issued on `stream` so far has written it. Does not wait unless every slot is
  /// still unread (then for the oldest only).
  void push(std::int64_t step, const float* device_loss, stream_t stream = {}) {
    if (in_flight_ == capacity()) {  // the reader is `slots` steps behind: make room
      wait_slot(oldest());
      take_oldest();
    }
    const std::size_t k = head_;
#if DTF_CUDA
    for_each_index(stream, 1, detail::raise_nonfinite{device_loss, flag_, step}, "device::loss_ring (flag)");
    detail::check_ring(cudaMemcpyAsync(&slots_[k].loss, device_loss, sizeof(float), cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpyAsync (loss)");
    detail::check_ring(cudaMemcpyAsync(&slots_[k].flag, flag_, sizeof(std::int64_t), cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpyAsync (flag)");
    detail::check_ring(cudaEventRecord(events_[k], stream), "cudaEventRecord");
#else
    for_each_index(stream, 1, detail::raise_nonfinite{device_loss, &flag_, step});
    slots_[k] = {*device_loss, flag_};
#endif
    steps_[k] = step;
    head_ = (head_ + 1) % capacity();
    ++in_flight_;
  }

  /// The entries whose copies have completed, oldest first, each returned once. Never waits.
  std::vector<step_loss> poll() {
    while (in_flight_ > 0) {
#if DTF_CUDA
      const cudaError_t rc = cudaEventQuery(events_[oldest()]);
      if (rc == cudaErrorNotReady) break;
      detail::check_ring(rc, "cudaEventQuery");
#endif
      take_oldest();
    }
    return std::exchange(ready_, {});
  }

  /// Waits for every entry in flight and returns them with poll()'s (the end of a run).
  std::vector<step_loss> drain() {
    for (std::size_t i = 0; i < in_flight_; ++i) wait_slot((oldest() + i) % capacity());
    return poll();
  }

  /// The first step whose loss was NaN or infinite, among the entries returned so far (the flag
  /// travels with each entry, so a bad step is seen by the next entry returned).
  std::optional<std::int64_t> first_nonfinite() const noexcept {
    if (first_bad_ == 0) return std::nullopt;
    return first_bad_ - 1;
  }

  /// The device flag: 0 while every loss pushed was finite, else the first bad step + 1.
  const std::int64_t* device_flag() const noexcept {
#if DTF_CUDA
    return flag_;
#else
    return &flag_;
#endif
  }

 private:
  std::size_t oldest() const noexcept { return (head_ + capacity() - in_flight_) % capacity(); }

  // The host waits for slot k's copies: blocking without a check, else polling with it.
  void wait_slot(std::size_t k) {
    if (!check_) {
#if DTF_CUDA
      detail::check_ring(cudaEventSynchronize(events_[k]), "cudaEventSynchronize");
#endif
      return;
    }
    const auto since = std::chrono::steady_clock::now();
    for (;;) {
      check_(since);
#if DTF_CUDA
      const cudaError_t rc = cudaEventQuery(events_[k]);
      if (rc != cudaErrorNotReady) return detail::check_ring(rc, "cudaEventQuery");
      std::this_thread::yield();
#else
      (void)k;
      return;
#endif
    }
  }

  // The oldest entry in flight has landed: keep it for the next poll.
  void take_oldest() {
    const std::size_t k = oldest();
    ready_.push_back({steps_[k], slots_[k].loss});
    if (first_bad_ == 0) first_bad_ = slots_[k].flag;
    --in_flight_;
  }

  void release() noexcept {
#if DTF_CUDA
    for (auto& e : events_)
      if (e) {
        cudaEventSynchronize(e);  // a copy may still write its slot
        cudaEventDestroy(std::exchange(e, nullptr));
      }
    if (slots_) cudaFreeHost(std::exchange(slots_, nullptr));
    if (flag_) cudaFree(std::exchange(flag_, nullptr));
#endif
  }

  std::vector<std::int64_t> steps_;  // the step of each slot
  std::size_t head_ = 0;             // the next slot to write
  std::size_t in_flight_ = 0;        // slots written and not yet returned
  std::vector<step_loss> ready_;     // landed, waiting for poll()
  std::int64_t first_bad_ = 0;       // the flag as the host has seen it
  wait_check check_;                 // set_wait_check
#if DTF_CUDA
  detail::loss_slot* slots_ = nullptr;  // pinned
  std::vector<cudaEvent_t> events_;
  std::int64_t* flag_ = nullptr;  // device memory
#else
  std::vector<detail::loss_slot> slots_;
  std::int64_t flag_ = 0;
#endif
};

}  // namespace dtf::device
