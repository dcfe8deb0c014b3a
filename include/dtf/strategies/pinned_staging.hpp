// dtf/strategies/pinned_staging.hpp — the TCP ring's exchange of a CUDA build's gradient buckets
// through pinned host memory with asynchronous copies on the context's communication stream
// (docs/design/gpu-execution.md, section 6.0, whose numbered ordering rules the comments cite).
//
//   detail::pinned_staging s(buckets, prefix + n);        // once: pinned buffer, events
//   s.begin_step();                                        // each step
//   s.note(first, count, net.gradient_event());            // in the ready callback (training thread)
//   s.gradients_written(compute);                          // after the loss's slot, before finish()
//   s.reduce(k, bucket, comm, name, grads, comm_stream);   // the reducer's bucket k (its thread)
//   ctx.compute_waits_for_comm();                          // after finish(): the update follows
//
// bucket_waits (every build, tested on CPU with stand-in events): which event bucket k's copy
// waits for. A bucket whose floats were all reported by the model's ready callbacks waits for the
// event reported with its last range (recorded after every layer before it on the same stream;
// none when the model waited on the host before calling back); any other bucket (the one holding
// the loss's slot, every bucket without overlap) waits for the event recorded after the step's
// gradients and loss slot are written (gradients_written).
// CPU builds have no pinned_staging: the buckets are reduced in place (host memory).
// Thread safety: begin_step, note and gradients_written on the training thread; reduce on the
// reducer's thread once the bucket is ready (the reducer's mutex orders note's writes before it).
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/config.hpp>
#include <dtf/error.hpp>
#include <dtf/strategies/gradient_buckets.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if DTF_CUDA
#include <dtf/device/context.hpp>

#include <cuda_runtime.h>
#endif

namespace dtf::strategies::detail {

/// Per bucket of a step, what its device-to-host copy waits for (see the file comment). Event is
/// cudaEvent_t on CUDA builds (any copyable handle whose value-initialised state means none).
template <class Event>
class bucket_waits {
 public:
  /// What bucket k waits for: `reported` (every float reported by ready callbacks): `event`
  /// (none: the model waited on the host); otherwise the step's gradients_written event.
  struct wait {
    bool reported = false;
    Event event{};
  };

  explicit bucket_waits(std::vector<gradient_bucket> buckets)
      : buckets_(std::move(buckets)), unreported_(buckets_.size()), waits_(buckets_.size()) {
    begin_step();
  }

  /// A new step: nothing reported.
  void begin_step() {
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      unreported_[k] = buckets_[k].size();
      waits_[k] = {};
    }
  }

  /// Floats [first, first + count) (buffer coordinates) are written, as `event` says (none: final
  /// on the host). Called before the reducer hears of them. Errors: errc::invalid_argument for
  /// a range outside the buffer or reported twice.
  void note(std::size_t first, std::size_t count, Event event) {
    const std::size_t total = buffer_end(buckets_);
    if (first > total || count > total - first)
      throw error(errc::invalid_argument, "pinned staging: gradient reported outside the buffer: floats [" +
                                              std::to_string(first) + ", " + std::to_string(first + count) + ") of " +
                                              std::to_string(total));
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      const gradient_bucket& b = buckets_[k];
      const std::size_t lo = std::max(first, b.begin), hi = std::min(first + count, b.end);
      if (lo >= hi) continue;
      if (unreported_[k] < hi - lo)
        throw error(errc::invalid_argument, "pinned staging: gradient floats [" + std::to_string(lo) + ", " +
                                                std::to_string(hi) + ") reported twice");
      unreported_[k] -= hi - lo;
      // Backprop reports from the top layer down on one stream: the last range's event follows
      // the writes of every range before it.
      if (unreported_[k] == 0) waits_[k] = {true, event};
    }
  }

  /// What bucket k's copy waits for this step.
  wait at(std::size_t k) const { return waits_.at(k); }

 private:
  std::vector<gradient_bucket> buckets_;
  std::vector<std::size_t> unreported_;  // floats of bucket k not yet reported this step
  std::vector<wait> waits_;
};

#if DTF_CUDA
/// A model whose ready callbacks can leave the wait for the layer's event to the callee
/// (nn::sequential::set_ready_on_device; the event is gradient_event() during the callback).
template <class M>
concept orders_ready_on_device = requires(M& m, const M& cm) {
  m.set_ready_on_device(true);
  { cm.ready_on_device() } -> std::convertible_to<bool>;
  { cm.gradient_event() } -> std::convertible_to<cudaEvent_t>;
};

/// The pinned staging buffer and the events of the TCP ring's exchange (see the file comment).
class pinned_staging {
 public:
  /// Pinned host memory for `floats` floats (the exchange buffer's size), allocated once.
  /// Errors: errc::internal naming the CUDA call that failed.
  pinned_staging(std::vector<gradient_bucket> buckets, std::size_t floats) : waits_(std::move(buckets)), floats_(floats) {
    using device::detail::check;
    check(cudaHostAlloc(reinterpret_cast<void**>(&host_), floats * sizeof(float) + 1, cudaHostAllocDefault),
          "cudaHostAlloc (the exchange's pinned staging)");
    try {
      check(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      // The communication thread sleeps in rule 2's wait instead of spinning on a core.
      check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming | cudaEventBlockingSync),
            "cudaEventCreateWithFlags");
    } catch (...) {
      release();
      throw;
    }
  }
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  /// The copies that use the buffer must have completed (the engine's context drains its
  /// streams first).
  ~pinned_staging() { release(); }

  /// A new step (training thread).
  void begin_step() { waits_.begin_step(); }
  /// Floats [first, first + count) are written once `event` completes (null: final on the host).
  void note(std::size_t first, std::size_t count, cudaEvent_t event) { waits_.note(first, count, event); }
  /// Every gradient and the loss's slot are issued on `compute`: the buckets backprop did not
  /// complete wait for what is issued there so far (training thread, before the reducer's finish()).
  void gradients_written(cudaStream_t compute) {
    device::detail::check(cudaEventRecord(written_, compute), "cudaEventRecord (the step's gradients)");
  }

  /// Bucket k of `grads` (device memory, buffer coordinates) averaged over `comm`'s ranks in place:
  /// copied to the pinned buffer on `stream` once its writes are done (rule 1), the host waits
  /// for the copy (rule 2), the ring averages it, and it goes back on `stream` (rule 3); that copy
  /// is ordered for the device only (the training thread's compute_waits_for_comm, rule 5).
  void reduce(std::size_t k, const gradient_bucket& b, communicator& comm, const std::string& name, float* grads,
              cudaStream_t stream) {
    using device::detail::check;
    if (b.end > floats_) throw error(errc::invalid_argument, "pinned staging: bucket past the exchange buffer");
    const auto w = waits_.at(k);
    if (!w.reported) check(cudaStreamWaitEvent(stream, written_, 0), "cudaStreamWaitEvent (the step's gradients)");
    else if (w.event) check(cudaStreamWaitEvent(stream, w.event, 0), "cudaStreamWaitEvent (a layer's gradient)");
    const std::size_t bytes = b.size() * sizeof(float);
    check(cudaMemcpyAsync(host_ + b.begin, grads + b.begin, bytes, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (a bucket to pinned memory)");
    check(cudaEventRecord(copied_, stream), "cudaEventRecord (a bucket's copy)");
    check(cudaEventSynchronize(copied_), "cudaEventSynchronize (a bucket's copy)");
    comm.allreduce<float>(name, std::span<float>(host_ + b.begin, b.size()), reduce_op::average);
    check(cudaMemcpyAsync(grads + b.begin, host_ + b.begin, bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (a bucket's average to the device)");
  }

 private:
  void release() noexcept {
    if (copied_) cudaEventDestroy(copied_);
    if (written_) cudaEventDestroy(written_);
    if (host_) cudaFreeHost(host_);
  }

  bucket_waits<cudaEvent_t> waits_;
  std::size_t floats_;
  float* host_ = nullptr;
  cudaEvent_t written_{}, copied_{};
};

// During a ready callback: the event after the reported layer's writes when the model leaves the
// wait to the staging (null: the model waited on the host, the floats are final).
template <class M>
cudaEvent_t ready_event(const M& net) {
  if constexpr (orders_ready_on_device<M>)
    if (net.ready_on_device()) return net.gradient_event();
  return nullptr;
}

// The model's ready callbacks leave the layer's wait to the staging for one step's backprop
// (every exit): another user of the model gets the model's default back.
template <class M>
struct ready_guard {
  M& net;
  bool on;
  ready_guard(M& n, bool o) : net(n), on(o) {
    if constexpr (orders_ready_on_device<M>)
      if (on) net.set_ready_on_device(true);
  }
  ready_guard(const ready_guard&) = delete;
  ready_guard& operator=(const ready_guard&) = delete;
  ~ready_guard() {
    if constexpr (orders_ready_on_device<M>)
      if (on) net.set_ready_on_device(false);
  }
};
#endif

}  // namespace dtf::strategies::detail
