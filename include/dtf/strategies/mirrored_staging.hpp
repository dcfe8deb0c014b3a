// dtf/strategies/mirrored_staging.hpp — dtf::strategies::mirrored's host memory (docs/design/
// gpu-execution.md, section 2.1): pinned buffers allocated once with the engine, and replica 0's
// exchange of its gradient buckets across processes through one of them (the NCCL path, several
// processes; section 6.0's ordering rules, which the comments cite).
//
//   detail::pinned_floats host(prefix + n);                       // once: pinned (CUDA), zeros
//   detail::replica_staging s(prefix + n);                        // once: the copies' event (CUDA)
//   s.reduce(b, comm, name, grads, host.data(), stream);          // bucket b: to host, wait, ring, back
//   s.loss_to_host(grads, host.data(), stream);                   // one process: the loss, no wait
//   s.wait_loss();                                                 // the host waits; host[0] is the loss
//
// CUDA builds: `grads` is device memory, `stream` replica 0's communication stream; the copies are
// cudaMemcpyAsync on it, and the host waits only where it reads the bytes (reduce's wait before the
// ring, wait_loss). CPU builds: `grads` is host memory, the streams are the calling thread, and the
// copies are plain copies, so the exchange's arithmetic (the ring's, in place) is the same, bit for
// bit, and tested on CPU (tests/test_collectives.cpp "[staging]").
// Thread safety: one thread at a time per instance (mirrored: replica 0's).
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/config.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>
#include <dtf/strategies/gradient_buckets.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if DTF_CUDA
#include <dtf/detail/cuda_staging.hpp>  // dtf::detail::check_cuda

#include <cuda_runtime.h>
#endif

namespace dtf::strategies::detail {

/// `n` floats of host memory, zeros, allocated once: pinned (cudaHostAlloc) on CUDA builds, so
/// that cudaMemcpyAsync to and from it is asynchronous; a plain vector on CPU builds. Whoever
/// copies through it keeps it alive until the copies complete.
class pinned_floats {
 public:
  /// Errors: errc::internal naming cudaHostAlloc when it fails.
  explicit pinned_floats(std::size_t n = 0) : n_(n) {
#if DTF_CUDA
    void* p = nullptr;
    dtf::detail::check_cuda(cudaHostAlloc(&p, n * sizeof(float) + 1, cudaHostAllocDefault),
                            "cudaHostAlloc (mirrored's pinned buffer)");
    p_ = static_cast<float*>(p);
    std::fill(p_, p_ + n, 0.0f);
#else
    v_.assign(n, 0.0f);
    p_ = v_.data();
#endif
  }
  pinned_floats(pinned_floats&& o) noexcept
      : n_(std::exchange(o.n_, 0)), p_(std::exchange(o.p_, nullptr)) {
#if !DTF_CUDA
    v_ = std::move(o.v_);  // a moved vector keeps its buffer: p_ stays valid
#endif
  }
  pinned_floats& operator=(pinned_floats&&) = delete;
  pinned_floats(const pinned_floats&) = delete;
  pinned_floats& operator=(const pinned_floats&) = delete;
  ~pinned_floats() {
#if DTF_CUDA
    if (p_) cudaFreeHost(p_);
#endif
  }

  float* data() noexcept { return p_; }
  const float* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  float& operator[](std::size_t i) noexcept { return p_[i]; }
  float operator[](std::size_t i) const noexcept { return p_[i]; }
  std::span<float> span() noexcept { return {p_, n_}; }
  std::span<const float> span() const noexcept { return {p_, n_}; }

 private:
  std::size_t n_;
  float* p_ = nullptr;
#if !DTF_CUDA
  std::vector<float> v_;
#endif
};

/// Replica 0's exchange across processes through a pinned buffer (see the file comment).
class replica_staging {
 public:
  /// For buffers of `floats` floats ([loss, 15 zeros, gradient]). Errors: errc::internal naming
  /// the CUDA call that failed.
  explicit replica_staging(std::size_t floats) : floats_(floats) {
#if DTF_CUDA
    // The waiting thread sleeps in the wait instead of spinning on a core.
    dtf::detail::check_cuda(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming | cudaEventBlockingSync),
                            "cudaEventCreateWithFlags (mirrored's staging)");
#endif
  }
  replica_staging(const replica_staging&) = delete;
  replica_staging& operator=(const replica_staging&) = delete;
  /// The copies must have completed (mirrored: the replicas' contexts drain their streams first).
  ~replica_staging() {
#if DTF_CUDA
    if (copied_) cudaEventDestroy(copied_);
#endif
  }

  /// Bucket b of `grads` averaged over `comm`'s ranks in place, through host[b.begin, b.end):
  /// copied to the host on `stream` after the work issued there so far (rule 1: the group's
  /// average is on the same stream), the host waits for the copy (rule 2), the ring averages the
  /// host floats, and they go back on `stream` (rule 3) with no host wait. Errors:
  /// errc::invalid_argument for a bucket past the buffer; the communicator's; errc::internal
  /// naming a CUDA call.
  void reduce(const gradient_bucket& b, communicator& comm, const std::string& name, float* grads, float* host,
              [[maybe_unused]] device::stream_t stream) {
    if (b.begin > b.end || b.end > floats_)
      throw error(errc::invalid_argument, "mirrored staging: bucket [" + std::to_string(b.begin) + ", " +
                                              std::to_string(b.end) + ") past the buffer of " +
                                              std::to_string(floats_) + " floats");
    const std::size_t bytes = b.size() * sizeof(float);
#if DTF_CUDA
    using dtf::detail::check_cuda;
    check_cuda(cudaMemcpyAsync(host + b.begin, grads + b.begin, bytes, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync (mirrored: a bucket to pinned memory)");
    check_cuda(cudaEventRecord(copied_, stream), "cudaEventRecord (mirrored: a bucket's copy)");
    check_cuda(cudaEventSynchronize(copied_), "cudaEventSynchronize (mirrored: a bucket's copy)");
#else
    std::copy(grads + b.begin, grads + b.end, host + b.begin);
#endif
    comm.allreduce<float>(name, std::span<float>(host + b.begin, b.size()), reduce_op::average);
#if DTF_CUDA
    check_cuda(cudaMemcpyAsync(grads + b.begin, host + b.begin, bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync (mirrored: a bucket's average to the device)");
#else
    (void)bytes;
    std::copy(host + b.begin, host + b.end, grads + b.begin);
#endif
  }

  /// host[0] := grads[0] (the loss's slot) once the work issued on `stream` so far wrote it;
  /// the host does not wait (wait_loss does).
  void loss_to_host(const float* grads, float* host, [[maybe_unused]] device::stream_t stream) {
#if DTF_CUDA
    using dtf::detail::check_cuda;
    check_cuda(cudaMemcpyAsync(host, grads, sizeof(float), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync (mirrored: the loss to pinned memory)");
    check_cuda(cudaEventRecord(copied_, stream), "cudaEventRecord (mirrored: the loss's copy)");
#else
    host[0] = grads[0];
#endif
  }
  /// The host waits for loss_to_host's copy.
  void wait_loss() {
#if DTF_CUDA
    dtf::detail::check_cuda(cudaEventSynchronize(copied_), "cudaEventSynchronize (mirrored: the loss's copy)");
#endif
  }

 private:
  std::size_t floats_;
#if DTF_CUDA
  cudaEvent_t copied_{};
#endif
};

}  // namespace dtf::strategies::detail
