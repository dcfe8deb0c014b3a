// dtf/device/pinned_upload.hpp — host-to-device copies that do not block the host: through a
// pinned buffer allocated once, with cudaMemcpyAsync on the caller's stream (docs/design/
// gpu-execution.md, section 3: a device_shard's per-epoch order).
//
//   dtf::device::pinned_upload up(bytes);           // the pinned buffer, allocated once
//   up.upload(device_dst, host_src, bytes, stream);  // returns once src is in the pinned buffer
//
// A copy from pageable memory makes the host wait (the driver stages it); from pinned memory
// cudaMemcpyAsync returns at once and the DMA engine reads the buffer later, so the host must not
// overwrite the buffer while a copy still reads it: an event is recorded after each copy and the
// next upload waits for it before writing the buffer (the host waits only when the device has
// not yet reached the last upload's copy; an epoch's upload comes an epoch after the last one).
// The source is copied into the buffer first, so the caller may reuse it at once. A larger
// upload than the buffer grows it (after the last copy: a wait and a new allocation, never in a
// steady state).
// CPU builds: the same calls with an ordinary host buffer in place of the pinned one (device
// memory is host memory; every copy has completed when upload returns).
// Errors: errc::internal naming the CUDA call that failed.
// Thread safety: one thread at a time per instance.
#pragma once

#include <dtf/config.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::device {

/// Host-to-device copies through a pinned buffer (see the file comment).
class pinned_upload {
 public:
  /// A buffer of `bytes` bytes (pinned on CUDA builds), allocated now.
  explicit pinned_upload(std::size_t bytes = 0) {
#if DTF_CUDA
    check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
#endif
    grow(bytes);
  }
  /// Takes o's buffer and event; o is left empty.
  pinned_upload(pinned_upload&& o) noexcept { swap(o); }
  /// Takes o's buffer and event; this one's are released.
  pinned_upload& operator=(pinned_upload&& o) noexcept {
    pinned_upload(std::move(o)).swap(*this);
    return *this;
  }
  pinned_upload(const pinned_upload&) = delete;
  pinned_upload& operator=(const pinned_upload&) = delete;
  /// Waits for the last copy (it reads the buffer), then frees the buffer.
  ~pinned_upload() {
#if DTF_CUDA
    if (copied_) {
      if (issued_) cudaEventSynchronize(copied_);
      cudaEventDestroy(copied_);
    }
    if (buf_) cudaFreeHost(buf_);
#endif
  }

  /// Copies `bytes` bytes from host memory `src` to device memory `dst` on `stream`, after the
  /// work issued there so far; returns once src is in the buffer (src may then be reused), the
  /// copy itself still in flight on CUDA builds. Whoever reads dst orders its reads after it
  /// (the same stream, or an event).
  void upload(void* dst, const void* src, std::size_t bytes, stream_t stream) {
    if (bytes == 0) return;
#if DTF_CUDA
    if (issued_) check(cudaEventSynchronize(copied_), "cudaEventSynchronize (the last upload)");
    issued_ = false;
    grow(bytes);
    std::memcpy(buf_, src, bytes);
    check(cudaMemcpyAsync(dst, buf_, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (upload)");
    check(cudaEventRecord(copied_, stream), "cudaEventRecord (upload)");
    issued_ = true;
#else
    (void)stream;
    grow(bytes);
    std::memcpy(buf_.data(), src, bytes);
    std::memcpy(dst, buf_.data(), bytes);
#endif
  }

  /// The buffer's size in bytes, and the allocations made for it so far (1 in a steady state).
  ///@{
  std::size_t capacity() const noexcept { return capacity_; }
  std::uint64_t allocations() const noexcept { return allocations_; }
  ///@}

 private:
  // At least `bytes` bytes (no copy reads the buffer when called).
  void grow(std::size_t bytes) {
    if (bytes <= capacity_) return;
#if DTF_CUDA
    if (buf_) check(cudaFreeHost(buf_), "cudaFreeHost");
    buf_ = nullptr;
    capacity_ = 0;
    check(cudaHostAlloc(&buf_, bytes, cudaHostAllocDefault), "cudaHostAlloc (upload buffer)");
#else
    buf_.resize(bytes);
#endif
    capacity_ = bytes;
    ++allocations_;
  }
  void swap(pinned_upload& o) noexcept {
    std::swap(buf_, o.buf_);
    std::swap(capacity_, o.capacity_);
    std::swap(allocations_, o.allocations_);
#if DTF_CUDA
    std::swap(copied_, o.copied_);
    std::swap(issued_, o.issued_);
#endif
  }
#if DTF_CUDA
  static void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) throw error(errc::internal, std::string("device::pinned_upload: ") + what + ": " + cudaGetErrorString(rc));
  }
  void* buf_ = nullptr;
  cudaEvent_t copied_{};
  bool issued_ = false;  // a copy was recorded on copied_ since the last wait
#else
  std::vector<std::byte> buf_;
#endif
  std::size_t capacity_ = 0;
  std::uint64_t allocations_ = 0;
};

}  // namespace dtf::device
