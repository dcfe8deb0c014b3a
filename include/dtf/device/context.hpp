// dtf/device/context.hpp — the execution context of a training engine: its streams, its pool of
// device memory for temporaries, Thrust policies on its compute stream, and the counters that
// prove a steady-state step allocates nothing (docs/design/gpu-execution.md, section 2).
//
//   dtf::device::context ctx;                       // on the current device (device::select_device)
//   thrust::for_each(ctx.policy(), first, last, f);  // on the compute stream, temporaries from the pool
//   auto before = ctx.pool().stats();
//   ... a step ...
//   assert(ctx.pool().stats().system_allocations == before.system_allocations);
//
// CUDA builds: a compute stream and a communication stream, both created non-blocking (never the
// legacy default stream); a cuBLAS handle bound to the compute stream with a workspace allocated
// once; a cuBLASLt handle with a fixed workspace of its own (allocated once) for the dense layers'
// epilogue GEMMs, each issued on the compute stream (lt(); docs/design/gpu-execution.md, 4.1);
// temporaries from the device's stream-ordered pool (cudaMallocAsync/cudaFreeAsync on the
// compute stream) whose release threshold is raised to its maximum, so that memory freed in one
// step serves the next instead of going back to the driver; Thrust policies that do not
// synchronise (thrust::cuda::par_nosync) with an allocator drawing from that pool.
// CPU builds: the same type over Thrust's device system on the host. The streams are the calling
// thread (every call completes before it returns), the pool keeps freed blocks by size and
// serves them again, the policy is thrust::device with the pool's allocator.
// On both, the pool counts the requests it served and the allocations it made from the system
// (the CUDA driver, or the C++ heap): in a steady state the second count does not move.
// nn::sequential::set_context(ctx) runs a model's step on the compute stream with the cuBLAS
// handle; ring_allreduce's engine (so dtf::train's collective and single-process runs) creates
// one context and runs its step there (dtf/strategies/engine_context.hpp), and mirrored one per
// replica (dtf/strategies/mirrored_replicas.hpp); the ps strategies create none (their staging
// orders its copies against the model's stream; docs/design/gpu-execution.md says what is built).
// Thread safety: none; a context serves one engine (one thread) at a time.
#pragma once

#include <dtf/config.hpp>
#include <dtf/error.hpp>

#include <thrust/execution_policy.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <new>
#include <string>
#include <vector>

#if DTF_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>
#endif

namespace dtf::device {

namespace detail {
#if DTF_CUDA
inline void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw error(errc::internal, std::string(what) + ": " + cudaGetErrorString(rc));
}
#endif
}  // namespace detail

/// What a pool has done so far.
struct pool_stats {
  std::uint64_t requests = 0;            ///< allocations asked of the pool
  std::uint64_t system_allocations = 0;  ///< of those, the ones it made from the system (the driver, the heap)
  std::uint64_t bytes_reserved = 0;      ///< bytes it holds from the system, in use or kept for reuse
};

/// Device memory for temporaries, ordered on one stream, reused from step to step (see the file
/// comment). Blocks freed are kept and served again to requests of the same size.
class memory_pool {
 public:
#if DTF_CUDA
  /// A pool whose blocks are ordered on `stream` (the current device's pool, kept whole).
  explicit memory_pool(cudaStream_t stream) : stream_(stream) {
    int device = 0;
    detail::check(cudaGetDevice(&device), "cudaGetDevice");
    detail::check(cudaDeviceGetDefaultMemPool(&pool_, device), "cudaDeviceGetDefaultMemPool");
    std::uint64_t keep = UINT64_MAX;
    detail::check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep),
                  "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
#else
  memory_pool() = default;
#endif
  memory_pool(const memory_pool&) = delete;
  memory_pool& operator=(const memory_pool&) = delete;
  ~memory_pool() {
#if !DTF_CUDA
    for (auto& [bytes, blocks] : free_)
      for (void* p : blocks) ::operator delete(p, std::align_val_t{alignment});
#endif
  }

  /// A block of at least `bytes` bytes, usable by work issued on the pool's stream from now on.
  /// Errors: errc::internal when the system has no memory left.
  void* allocate(std::size_t bytes) {
    ++stats_.requests;
    if (bytes == 0) bytes = 1;
#if DTF_CUDA
    void* p = nullptr;
    detail::check(cudaMallocAsync(&p, bytes, pool_, stream_), "cudaMallocAsync");
    std::uint64_t reserved = 0;
    detail::check(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved),
                  "cudaMemPoolGetAttribute(ReservedMemCurrent)");
    if (reserved > stats_.bytes_reserved) ++stats_.system_allocations;  // the pool grew
    stats_.bytes_reserved = reserved;
    return p;
#else
    if (auto it = free_.find(bytes); it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    void* p = ::operator new(bytes, std::align_val_t{alignment});
    ++stats_.system_allocations;
    stats_.bytes_reserved += bytes;
    return p;
#endif
  }

  /// Returns a block from allocate(bytes), once the work issued on the pool's stream so far no
  /// longer uses it.
  void deallocate(void* p, std::size_t bytes) {
    if (!p) return;
    if (bytes == 0) bytes = 1;
#if DTF_CUDA
    cudaFreeAsync(p, stream_);
#else
    free_[bytes].push_back(p);
#endif
  }

  /// What the pool has done so far.
  pool_stats stats() const noexcept { return stats_; }

 private:
  pool_stats stats_;
#if DTF_CUDA
  cudaStream_t stream_{};
  cudaMemPool_t pool_{};
#else
  static constexpr std::size_t alignment = 64;
  std::map<std::size_t, std::vector<void*>> free_;  // blocks kept for reuse, by size
#endif
};

/// Thrust's view of a pool: temporary storage of Thrust's algorithms drawn from it.
class thrust_allocator {
 public:
  using value_type = char;  ///< Thrust allocates temporaries as bytes
  /// An allocator drawing from `pool`.
  explicit thrust_allocator(memory_pool& pool) noexcept : pool_(&pool) {}
  /// n bytes from the pool.
  char* allocate(std::ptrdiff_t n) { return static_cast<char*>(pool_->allocate(std::size_t(n))); }
  /// Gives n bytes back to the pool.
  void deallocate(char* p, std::size_t n) { pool_->deallocate(p, n); }

 private:
  memory_pool* pool_;
};

#if DTF_CUDA
/// What a cuBLASLt matmul of the context is issued with: the handle, the fixed workspace and the
/// compute stream (cuBLASLt takes the stream per call; it binds none to the handle).
struct blas_lt {
  cublasLtHandle_t handle{};
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  cudaStream_t stream{};
};
#endif

/// The execution context of one training engine (see the file comment).
class context {
 public:
#if DTF_CUDA
  /// Streams, the cuBLAS handle and its workspace (`blas_workspace_bytes`, allocated once), the
  /// cuBLASLt handle and its workspace (`lt_workspace_bytes`, allocated once) on the current
  /// device. Errors: errc::internal naming the CUDA, cuBLAS or cuBLASLt call that failed.
  explicit context(std::size_t blas_workspace_bytes = std::size_t(32) << 20,
                   std::size_t lt_workspace_bytes = std::size_t(32) << 20)
      : compute_(make_stream()), comm_(make_stream()), pool_(compute_) {
    detail::check(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) throw error(errc::internal, "device::context: cublasCreate failed");
    detail::check(cudaMalloc(&blas_workspace_, blas_workspace_bytes), "cudaMalloc (cuBLAS workspace)");
    if (cublasSetStream(blas_, compute_) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(blas_, blas_workspace_, blas_workspace_bytes) != CUBLAS_STATUS_SUCCESS)
      throw error(errc::internal, "device::context: binding cuBLAS to the compute stream failed");
    if (cublasLtCreate(&lt_.handle) != CUBLAS_STATUS_SUCCESS)
      throw error(errc::internal, "device::context: cublasLtCreate failed");
    detail::check(cudaMalloc(&lt_.workspace, lt_workspace_bytes), "cudaMalloc (cuBLASLt workspace)");
    lt_.workspace_bytes = lt_workspace_bytes;
    lt_.stream = compute_;
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() {
    cudaStreamSynchronize(compute_);
    cudaStreamSynchronize(comm_);
    if (blas_) cublasDestroy(blas_);
    if (blas_workspace_) cudaFree(blas_workspace_);
    if (lt_.handle) cublasLtDestroy(lt_.handle);
    if (lt_.workspace) cudaFree(lt_.workspace);
    if (comm_done_) cudaEventDestroy(comm_done_);
    cudaStreamDestroy(comm_);
    cudaStreamDestroy(compute_);
  }

  /// The compute stream (kernels, GEMMs, the pool's order) and the communication stream.
  ///@{
  cudaStream_t compute_stream() const noexcept { return compute_; }
  cudaStream_t comm_stream() const noexcept { return comm_; }
  ///@}
  /// The cuBLAS handle bound to the compute stream, with its own workspace.
  cublasHandle_t blas() const noexcept { return blas_; }
  /// The cuBLASLt handle, its fixed workspace and the compute stream its matmuls are issued on.
  const blas_lt& lt() const noexcept { return lt_; }

  /// A Thrust policy on the compute stream that does not synchronise, its temporaries from the pool.
  auto policy() { return thrust::cuda::par_nosync(thrust_allocator(pool_)).on(compute_); }

  /// The compute stream waits (on the device, the host does not) for the work issued so far on
  /// the communication stream.
  void compute_waits_for_comm() {
    detail::check(cudaEventRecord(comm_done_, comm_), "cudaEventRecord");
    detail::check(cudaStreamWaitEvent(compute_, comm_done_, 0), "cudaStreamWaitEvent");
  }
  /// Blocks the host until both streams are idle (for reads at a hook's cadence, never per step).
  void synchronize() {
    detail::check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize (compute)");
    detail::check(cudaStreamSynchronize(comm_), "cudaStreamSynchronize (communication)");
  }
#else
  /// CPU builds: nothing to create (the streams are the calling thread).
  context() = default;
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  /// A Thrust policy of the device system (OpenMP or sequential on the host), its temporaries
  /// from the pool.
  auto policy() { return thrust::device(thrust_allocator(pool_)); }
  /// No-op on CPU builds: every call has completed when it returns.
  void compute_waits_for_comm() {}
  /// No-op on CPU builds (see compute_waits_for_comm).
  void synchronize() {}
#endif

  /// The pool of the step's temporaries.
  memory_pool& pool() noexcept { return pool_; }

 private:
#if DTF_CUDA
  static cudaStream_t make_stream() {
    cudaStream_t s{};
    detail::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  cudaStream_t compute_{}, comm_{};
  cudaEvent_t comm_done_{};
  cublasHandle_t blas_{};
  void* blas_workspace_ = nullptr;
  blas_lt lt_;
#endif
  memory_pool pool_;
};

}  // namespace dtf::device
