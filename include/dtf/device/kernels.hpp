// dtf/device/kernels.hpp — the two launch shapes the fused step needs, issued on a stream of the
// caller's choice with no allocation and no host read (docs/design/gpu-execution.md, section 4):
//
//   dtf::device::for_each_index(stream, n, f);         // f(i) for i in [0, n), one thread each
//   dtf::device::mean_of(stream, values, n, out);      // *out = (sum of values[0..n)) / n
//
// mean_of is deterministic: one block of `reduce_threads` threads, thread t summing the values
// t, t + reduce_threads, ... in that order, then a tree over shared memory in a fixed order; no
// atomics, so the same inputs give the same bits on every run and in a replayed CUDA graph (the
// order differs from a sequential sum: results agree with it within rounding, not bitwise).
// CPU builds: the same calls run on the calling thread (`stream` is ignored, they complete before
// they return); mean_of sums in index order, as the CPU paths always have.
// Kernels are templates so that a header included by several translation units defines them
// once (template instances are merged by the linker; a plain __global__ function would not be).
// Errors: errc::internal naming the launch when CUDA refuses it (a launch's own faults surface
// at the next synchronising call, as CUDA reports them).
#pragma once

#include <dtf/config.hpp>
#include <dtf/error.hpp>

#include <cstddef>
#include <string>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::device {

#if DTF_CUDA
/// The stream work is issued on (CUDA's cudaStream_t; 0 is the legacy default stream).
using stream_t = cudaStream_t;
#else
/// The stream work is issued on: a placeholder on CPU builds (work runs on the calling thread).
using stream_t = void*;
#endif

/// Threads of mean_of's block (a power of two).
inline constexpr unsigned reduce_threads = 256;

namespace detail {
#if DTF_CUDA
template <class F>
__global__ void for_each_index_kernel(F f, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}

template <unsigned Threads>
__global__ void mean_of_kernel(const float* values, std::size_t n, float* out) {
  __shared__ float partial[Threads];
  float s = 0.0f;
  for (std::size_t i = threadIdx.x; i < n; i += Threads) s += values[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half = Threads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = n == 0 ? 0.0f : partial[0] / float(n);
}

inline void check_launch(const char* what) {
  if (const cudaError_t rc = cudaGetLastError(); rc != cudaSuccess)
    throw error(errc::internal, std::string(what) + ": kernel launch failed: " + cudaGetErrorString(rc));
}
#endif
}  // namespace detail

/// Calls f(i) for every i in [0, n) on `stream`, one device thread per index (CPU builds: in
/// index order on the calling thread). `what` names the launch in errors.
template <class F>
void for_each_index(stream_t stream, std::size_t n, F f, const char* what = "device::for_each_index") {
  if (n == 0) return;
#if DTF_CUDA
  constexpr unsigned threads = 256;
  const std::size_t blocks = (n + threads - 1) / threads;
  detail::for_each_index_kernel<F><<<unsigned(blocks), threads, 0, stream>>>(f, n);
  detail::check_launch(what);
#else
  (void)stream;
  (void)what;
  for (std::size_t i = 0; i < n; ++i) f(i);
#endif
}

/// Writes the mean of values[0..n) into *out (device memory; 0 when n is 0) on `stream`,
/// deterministically (see the file comment).
inline void mean_of(stream_t stream, const float* values, std::size_t n, float* out) {
#if DTF_CUDA
  detail::mean_of_kernel<reduce_threads><<<1, reduce_threads, 0, stream>>>(values, n, out);
  detail::check_launch("device::mean_of");
#else
  (void)stream;
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += values[i];
  *out = n == 0 ? 0.0f : s / float(n);
#endif
}

}  // namespace dtf::device
