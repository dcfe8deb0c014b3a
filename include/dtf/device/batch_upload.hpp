// dtf/device/batch_upload.hpp — a host batch (features and labels) into device tensors without a
// host wait in a steady state: through a ring of pinned slots, with cudaMemcpyAsync on the stream
// that reads the tensors (docs/design/gpu-execution.md, section 3.1).
//
//   dtf::device::batch_upload up;                      // 3 slots, allocated when first used
//   up.upload(x, b.features, y, b.labels, stream, [&] { /* the host waits for stream */ });
//
// A copy from pageable memory makes the host wait; from pinned memory cudaMemcpyAsync returns at
// once and the DMA engine reads the slot later. So each slot has an event recorded after its
// copies, and the host waits for it only before writing that slot again, `slots` batches later
// (no wait unless the host runs that far ahead of the device). The copies follow the work issued
// on `stream` before them: the previous step's reads of the tensors, when they are on the same
// stream. A tensor reshaped within its allocation touches no memory (tensor::resize); one that
// grows past it is reallocated by Thrust on the legacy stream, which a non-blocking stream does
// not wait for: `settle` (the caller's host wait for `stream`) is called first, then only. A slot grows (freed, allocated again) only
// when a larger batch comes: with the same shapes nothing is allocated.
// CPU builds: the same calls and counts (the slots' rotation, allocations and settles follow the
// CUDA build's policy), but the containers are copied straight into the tensors (device memory is
// host memory: a slot would only add a copy), the bits of assign_from_host; every copy has
// completed when upload returns (waits() stays 0).
// Errors: errc::invalid_argument for zero slots; errc::internal naming the CUDA call that failed.
// Thread safety: one thread at a time per instance.
#pragma once

#include <dtf/config.hpp>
#include <dtf/device/kernels.hpp>  // stream_t
#include <dtf/dtype.hpp>
#include <dtf/error.hpp>
#include <dtf/shape.hpp>
#include <dtf/tensor.hpp>

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

/// Host batches into device tensors through pinned slots (see the file comment).
class batch_upload {
 public:
  /// The labels' offset in a slot: the features' bytes rounded up to this.
  static constexpr std::size_t alignment = 256;

  /// A ring of `slots` slots (each allocated when first used).
  explicit batch_upload(std::size_t slots = 3) {
    if (slots == 0) throw error(errc::invalid_argument, "device::batch_upload: zero slots (at least one is needed)");
    slots_.resize(slots);
#if DTF_CUDA
    try {
      for (slot& s : slots_) check(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    } catch (...) {
      release();
      throw;
    }
#endif
  }
  /// Takes o's slots; o is left without any.
  batch_upload(batch_upload&& o) noexcept { swap(o); }
  /// Takes o's slots; this one's are released.
  batch_upload& operator=(batch_upload&& o) noexcept {
    batch_upload(std::move(o)).swap(*this);
    return *this;
  }
  batch_upload(const batch_upload&) = delete;
  batch_upload& operator=(const batch_upload&) = delete;
  /// Waits for the copies in flight (they read the slots), then frees the slots.
  ~batch_upload() { release(); }

  /// Copies host containers `a` and `b` (contiguous, row-major: xtensor, e.g. a host_batch's
  /// features and labels) into device tensors `x` and `y` on `stream`, resizing them to the
  /// containers' shapes and element types; `settle()` is called first when a tensor grows
  /// past its allocation. Returns once both are in the slot (the containers may then be reused), the copies
  /// still in flight on CUDA builds: whoever reads x and y orders its reads after them (the same
  /// stream, or an event).
  template <class A, class B, class Settle>
  void upload(tensor& x, const A& a, tensor& y, const B& b, [[maybe_unused]] stream_t stream, Settle&& settle) {
    using TA = typename A::value_type;
    using TB = typename B::value_type;
    dims sa(a.shape().begin(), a.shape().end()), sb(b.shape().begin(), b.shape().end());
    const std::size_t abytes = num_elements(sa) * sizeof(TA), bbytes = num_elements(sb) * sizeof(TB);
    const std::size_t offset = (abytes + alignment - 1) / alignment * alignment;
    if (slots_.empty()) throw error(errc::invalid_argument, "device::batch_upload: upload on a moved-from instance");
    slot& s = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    wait(s);
    grow(s, offset + bbytes);
#if DTF_CUDA
    std::byte* buf = s.buf;
    if (abytes) std::memcpy(buf, a.data(), abytes);
    if (bbytes) std::memcpy(buf + offset, b.data(), bbytes);
#endif
    if (abytes > x.capacity_bytes() || bbytes > y.capacity_bytes()) {  // the tensors grow
      ++settles_;
      settle();
    }
    x.resize(std::move(sa), dtype_v<TA>);
    y.resize(std::move(sb), dtype_v<TB>);
#if DTF_CUDA
    if (abytes) check(cudaMemcpyAsync(x.bytes().data(), buf, abytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (features)");
    if (bbytes) check(cudaMemcpyAsync(y.bytes().data(), buf + offset, bbytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (labels)");
    check(cudaEventRecord(s.copied, stream), "cudaEventRecord (batch copied)");
    s.issued = true;
#else  // the containers straight into the tensors: no copy more than assign_from_host's
    if (abytes) std::memcpy(x.bytes().data(), a.data(), abytes);
    if (bbytes) std::memcpy(y.bytes().data(), b.data(), bbytes);
#endif
  }

  /// The slots; the one the next upload writes.
  ///@{
  std::size_t slots() const noexcept { return slots_.size(); }
  std::size_t next_slot() const noexcept { return next_; }
  ///@}
  /// Slot allocations so far (one per slot once each was used, then one per slot per larger
  /// batch), calls of `settle` (a tensor grew), and host waits for a slot's copy that
  /// had not completed (always 0 on CPU builds).
  ///@{
  std::uint64_t allocations() const noexcept { return allocations_; }
  std::uint64_t settles() const noexcept { return settles_; }
  std::uint64_t waits() const noexcept { return waits_; }
  ///@}

 private:
  struct slot {
#if DTF_CUDA
    std::byte* buf = nullptr;  // pinned (cudaHostAlloc)
    cudaEvent_t copied{};      // recorded after the slot's copies
    bool issued = false;       // a copy was recorded on `copied` since the last wait
#endif
    std::size_t capacity = 0;  // CPU builds: what the slot would hold (no buffer: see grow)
  };

  // The host waits for the slot's last copy (it reads the slot) when it has not completed.
  void wait([[maybe_unused]] slot& s) {
#if DTF_CUDA
    if (!s.issued) return;
    cudaError_t rc = cudaEventQuery(s.copied);
    if (rc == cudaErrorNotReady) {
      ++waits_;
      rc = cudaEventSynchronize(s.copied);
    }
    check(rc, "cudaEventSynchronize (the slot's last copy)");
    s.issued = false;
#endif
  }

  // At least `bytes` bytes in the slot (no copy reads it when called).
  void grow(slot& s, std::size_t bytes) {
    if (bytes <= s.capacity) return;
#if DTF_CUDA
    if (s.buf) check(cudaFreeHost(std::exchange(s.buf, nullptr)), "cudaFreeHost");
    s.capacity = 0;
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc (batch slot)");
    s.buf = static_cast<std::byte*>(p);
#endif
    // CPU builds: no slot is needed (the containers are copied straight into the tensors, so the
    // step costs what it did); the capacity and the count follow the CUDA build's policy.
    s.capacity = bytes;
    ++allocations_;
  }

  void release() noexcept {
#if DTF_CUDA
    for (slot& s : slots_) {
      if (s.issued) cudaEventSynchronize(s.copied);
      if (s.copied) cudaEventDestroy(std::exchange(s.copied, nullptr));
      if (s.buf) cudaFreeHost(std::exchange(s.buf, nullptr));
    }
#endif
    slots_.clear();
  }

  void swap(batch_upload& o) noexcept {
    std::swap(slots_, o.slots_);
    std::swap(next_, o.next_);
    std::swap(allocations_, o.allocations_);
    std::swap(settles_, o.settles_);
    std::swap(waits_, o.waits_);
  }

#if DTF_CUDA
  static void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) throw error(errc::internal, std::string("device::batch_upload: ") + what + ": " + cudaGetErrorString(rc));
  }
#endif

  std::vector<slot> slots_;
  std::size_t next_ = 0;
  std::uint64_t allocations_ = 0, settles_ = 0, waits_ = 0;
};

}  // namespace dtf::device
