// dtf/optim/device_clip.hpp — clipping by global norm with no host read (docs/design/
// gpu-execution.md, section 2): the norm is reduced into a device scalar and the scale applied by
// a kernel that reads it, both issued on a stream of the caller's choice (a training engine's
// compute stream), so a step that clips never waits for the device.
//
//   dtf::optim::device_clip clip;
//   clip.apply(stream, grads, 1.0f);   // g *= min(1, max_norm / (norm + 1e-6)), on the device
//   double n = clip.norm(stream);       // the norm before clipping; the host waits (a hook's read)
//
// The arithmetic is clip_by_global_norm's (dtf/optim/clip.hpp, torch.nn.utils.clip_grad_norm_'s):
// the squares summed in double, sqrt, coef = max_norm / (norm + 1e-6) in double, and when coef is
// below 1 every float multiplied by float(coef); a non-finite norm leaves g alone.
// CUDA builds: the sum is a deterministic two-stage reduction with no atomics: a fixed grid of
// at most `clip_blocks` blocks of device::reduce_threads threads, block b's thread t summing the
// squares at b*T + t, b*T + t + B*T, ... in that order, each block's partial by a tree over shared
// memory in a fixed order, then one block reducing the partials the same way and writing the
// norm and the scale. The grid depends on the size alone, so the same gradient gives the same
// bits on every run and in a replayed CUDA graph; the order differs from the host's index order,
// so the norm agrees with clip_by_global_norm's within double rounding (relative error of order
// n * 2^-53 on a sum of n non-negative terms), not bitwise. Each square of a float is exact in
// double, so no contraction into a fused multiply-add changes a bit.
// CPU builds: the same calls run on the calling thread in index order, which is
// clip_by_global_norm's arithmetic bit for bit (tests/test_optim.cpp "[clip]").
// Memory: a workspace of clip_blocks + 2 doubles, allocated once at construction.
// Thread safety: one stream at a time per instance (the workspace is shared by its calls).
#pragma once

#include <dtf/config.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>

#include <thrust/device_vector.h>

#include <cmath>
#include <cstddef>
#include <span>
#include <string>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::optim {

/// Most blocks of device_clip's first stage (CUDA builds).
inline constexpr unsigned clip_blocks = 256;

namespace detail {
// coef's test as clip_by_global_norm's: the double to scale by, or 1 (leave g alone) when the
// norm is not finite or the coefficient is not below 1. `norm <= DBL_MAX` is false for NaN and
// infinity alike, on the host and on the device.
DTF_HD inline double clip_scale(double norm, float max_norm) {
  if (!(norm <= 1.7976931348623157e308)) return 1.0;
  const double coef = double(max_norm) / (norm + 1e-6);
  return coef >= 1.0 ? 1.0 : coef;
}
// g[i] *= float(*scale) when *scale is below 1 (the scale written by the reduction).
struct scale_below_one {
  float* g;
  const double* scale;
  DTF_HD void operator()(std::size_t i) const {
    const double s = *scale;
    if (s < 1.0) g[i] *= float(s);
  }
};

#if DTF_CUDA
// Stage 1: block b's sum of squares into partial[b] (see the file comment).
template <unsigned Threads>
__global__ void squares_partial_kernel(const float* g, std::size_t n, double* partial) {
  __shared__ double sum[Threads];
  const std::size_t stride = std::size_t(gridDim.x) * Threads;
  double s = 0.0;
  for (std::size_t i = std::size_t(blockIdx.x) * Threads + threadIdx.x; i < n; i += stride) s += double(g[i]) * double(g[i]);
  sum[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half = Threads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sum[threadIdx.x] += sum[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sum[0];
}
// Stage 2: one block; the partials summed the same way; out[0] = the norm, out[1] = the scale.
template <unsigned Threads>
__global__ void squares_final_kernel(const double* partial, unsigned blocks, float max_norm, double* out) {
  __shared__ double sum[Threads];
  double s = 0.0;
  for (unsigned i = threadIdx.x; i < blocks; i += Threads) s += partial[i];
  sum[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half = Threads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sum[threadIdx.x] += sum[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double norm = sqrt(sum[0]);
    out[0] = norm;
    out[1] = max_norm > 0.0f ? clip_scale(norm, max_norm) : 1.0;
  }
}
#endif
}  // namespace detail

/// Clipping by global norm on the device (see the file comment).
class device_clip {
 public:
  /// The workspace, allocated once (CUDA builds: on the legacy default stream, before any step).
  device_clip() : work_(clip_blocks + 2, 0.0) {}

  /// Writes the global norm of `g` (device memory) into the device scalar at norm_on_device()
  /// and, when max_norm is positive, clips g to it, all on `stream` with no host read; max_norm
  /// 0 computes the norm alone. Errors: errc::invalid_argument for a negative or NaN max_norm.
  void apply(device::stream_t stream, std::span<float> g, float max_norm) {
    if (!(max_norm >= 0.0f))
      throw error(errc::invalid_argument, "device_clip: max_norm " + std::to_string(max_norm) +
                                              " (must be 0, off, or positive)");
    double* w = thrust::raw_pointer_cast(work_.data());
    double* out = w + clip_blocks;
#if DTF_CUDA
    constexpr unsigned threads = device::reduce_threads;
    const std::size_t wanted = (g.size() + threads - 1) / threads;
    const unsigned blocks = wanted == 0 ? 1u : wanted < clip_blocks ? unsigned(wanted) : clip_blocks;
    detail::squares_partial_kernel<threads><<<blocks, threads, 0, stream>>>(g.data(), g.size(), w);
    device::detail::check_launch("optim::device_clip (partial sums)");
    detail::squares_final_kernel<threads><<<1, threads, 0, stream>>>(w, blocks, max_norm, out);
    device::detail::check_launch("optim::device_clip (norm)");
#else
    double sum = 0;  // clip_by_global_norm's loop, in index order
    for (const float x : g) sum += double(x) * double(x);
    out[0] = std::sqrt(sum);
    out[1] = max_norm > 0.0f ? detail::clip_scale(out[0], max_norm) : 1.0;
#endif
    if (max_norm > 0.0f)
      device::for_each_index(stream, g.size(), detail::scale_below_one{g.data(), out + 1}, "optim::device_clip (scale)");
  }

  /// The norm the last apply() wrote (0 before any), in device memory (host memory on CPU builds).
  const double* norm_on_device() const noexcept { return thrust::raw_pointer_cast(work_.data()) + clip_blocks; }

  /// The norm the last apply() computed (before clipping; 0 before any), once the work issued on
  /// `stream` so far has written it: the host waits for the stream (CUDA builds).
  double norm(device::stream_t stream) const {
#if DTF_CUDA
    double v = 0.0;
    cudaError_t rc = cudaMemcpyAsync(&v, norm_on_device(), sizeof v, cudaMemcpyDeviceToHost, stream);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream);
    if (rc != cudaSuccess) throw error(errc::internal, std::string("device_clip: reading the norm: ") + cudaGetErrorString(rc));
    return v;
#else
    (void)stream;
    return *norm_on_device();
#endif
  }

 private:
  thrust::device_vector<double> work_;  // [clip_blocks partial sums, the norm, the scale]
};

}  // namespace dtf::optim
