// dtf/detail/cuda_staging.hpp — the CUDA copy engine of dtf/detail/staging_pipeline.hpp: a
// pinned host staging buffer (cudaHostAlloc), a stream of its own and one event per segment in
// flight. Pinned memory is what lets cudaMemcpyAsync run on the copy engine while the host
// thread writes the previous segment to the socket (pageable memory would be staged by the
// driver again, synchronously).
//
// Ordering against a compute stream (set_stream(s); docs/design/gpu-execution.md, section 6.2):
// before a send's first copy the engine's stream waits (on the device) for an event recorded on
// s, so the copies read what s's work wrote; a reply's end (wait_all) hands its copies to s (s
// waits for an event after them) instead of the host waiting, and the host waits for them only
// before the staging buffer is reused (reserve, the next message). Without set_stream the host
// waits at the reply's end and a send's copies are not ordered after any stream (the caller has
// waited for the work that wrote the bytes).
//
// On CPU builds this header declares nothing: device memory is host memory there, and the ps
// traffic is read and written in place.
//
// Errors: every CUDA call that fails throws dtf::error (errc::internal for a failed copy or
// allocation) naming the call and carrying cudaGetErrorString's text.
// Thread safety: one thread at a time; the engine belongs to the current CUDA device at
// construction.
#pragma once

#include <dtf/config.hpp>
#include <dtf/detail/staging_pipeline.hpp>
#include <dtf/error.hpp>

#if DTF_CUDA
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <utility>

namespace dtf::detail {

/// Throws dtf::error naming `what` and CUDA's text for rc, unless rc is cudaSuccess.
inline void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw error(errc::internal, std::string(what) + " failed: " + cudaGetErrorString(rc) + " (" +
                                    cudaGetErrorName(rc) + ")");
}

/// A staging_copy_engine on a CUDA device (see the file comment).
class cuda_copy_engine {
 public:
  cuda_copy_engine() {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    for (auto* e : {&events_[0], &events_[1], &after_, &handed_}) {
      const cudaError_t rc = cudaEventCreateWithFlags(e, cudaEventDisableTiming);
      if (rc != cudaSuccess) {
        release();
        check_cuda(rc, "cudaEventCreateWithFlags");
      }
    }
  }
  /// Orders the copies against `compute` (see the file comment); null: no ordering (the default).
  void set_stream(cudaStream_t compute) noexcept { compute_ = compute; }
  /// A send's copies wait (on the device) for the work issued on the stream set so far.
  void before_send() {
    if (!compute_) return;
    check_cuda(cudaEventRecord(after_, compute_), "cudaEventRecord (ps staging: before the send)");
    check_cuda(cudaStreamWaitEvent(stream_, after_, 0), "cudaStreamWaitEvent (ps staging: before the send)");
  }
  cuda_copy_engine(const cuda_copy_engine&) = delete;
  cuda_copy_engine& operator=(const cuda_copy_engine&) = delete;
  ~cuda_copy_engine() { release(); }

  std::span<std::byte> reserve(std::size_t n) {
    if (handed_off_) {  // the host writes the buffer next (a reply): the last reply's copies must be done
      check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (ps staging: before reuse)");
      handed_off_ = false;
    }
    if (n > size_) {
      check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // the old buffer may still be read by a copy
      if (pinned_) check_cuda(cudaFreeHost(std::exchange(pinned_, nullptr)), "cudaFreeHost");
      size_ = 0;
      void* p = nullptr;
      check_cuda(cudaHostAlloc(&p, n, cudaHostAllocDefault), "cudaHostAlloc (ps staging buffer)");
      pinned_ = static_cast<std::byte*>(p);
      size_ = n;
    }
    return {pinned_, size_};
  }
  void to_staging(std::byte* d, const std::byte* s, std::size_t n) {
    check_cuda(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (device to staging)");
  }
  void from_staging(std::byte* d, const std::byte* s, std::size_t n) {
    check_cuda(cudaMemcpyAsync(d, s, n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (staging to device)");
  }
  // The pipeline waits for segment k before it marks k + 2: two events, used in turn, suffice.
  void mark(std::size_t k) { check_cuda(cudaEventRecord(events_[k % 2], stream_), "cudaEventRecord"); }
  void wait(std::size_t k) { check_cuda(cudaEventSynchronize(events_[k % 2]), "cudaEventSynchronize"); }
  /// Every copy issued is done: on the host, or, with a stream set, for the work issued on that
  /// stream from now on (the host waits at the next reserve).
  void wait_all() {
    if (!compute_) {
      check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      return;
    }
    check_cuda(cudaEventRecord(handed_, stream_), "cudaEventRecord (ps staging: the reply's copies)");
    check_cuda(cudaStreamWaitEvent(compute_, handed_, 0), "cudaStreamWaitEvent (ps staging: the reply's copies)");
    handed_off_ = true;
  }

 private:
  void release() noexcept {
    if (stream_) cudaStreamSynchronize(stream_);
    if (pinned_) cudaFreeHost(pinned_);
    for (auto* e : {&events_[0], &events_[1], &after_, &handed_})
      if (*e) cudaEventDestroy(std::exchange(*e, nullptr));
    if (stream_) cudaStreamDestroy(std::exchange(stream_, nullptr));
    pinned_ = nullptr;
    size_ = 0;
  }

  cudaStream_t stream_ = nullptr;
  std::array<cudaEvent_t, 2> events_{};
  cudaStream_t compute_ = nullptr;  // set_stream's (null: none)
  cudaEvent_t after_{}, handed_{};  // before a send's copies; after a reply's copies
  bool handed_off_ = false;         // a reply's copies handed to compute_, not waited for on the host
  std::byte* pinned_ = nullptr;
  std::size_t size_ = 0;
};
static_assert(staging_copy_engine<cuda_copy_engine>,
              "cuda_copy_engine must model staging_copy_engine: reserve, to_staging, from_staging, mark, wait, wait_all");

}  // namespace dtf::detail
#endif  // DTF_CUDA
