// dtf/torch/device.hpp — where the LibTorch adapter's tensors over dtf's memory live, and how
// LibTorch's work is ordered with dtf's (docs/guides/libtorch.md, "On a GPU").
//
// CPU builds: dtf's memory is host memory; every helper here is what the adapter did before
// (views on the CPU, memcpy, no waits). CUDA builds (DTF_CUDA): dtf's memory is on the current
// CUDA device (one GPU per process); views carry that device, copies go through LibTorch on its
// current stream, and the host waits where one side reads what the other wrote:
//   - wait_for_dtf() before LibTorch reads dtf's memory (dtf's update and gather run on dtf's
//     non-blocking streams, which LibTorch's stream does not wait for): cudaDeviceSynchronize;
//   - torch_work::wait() before dtf reads what LibTorch wrote (a gradient slice, a copy into
//     dtf's buffers): an event recorded on LibTorch's current stream, waited for on the host.
// Compiled with nvcc against LibTorch 1.13's headers; never run on a GPU.
#pragma once

#include <dtf/config.hpp>
#include <dtf/error.hpp>

#include <torch/torch.h>

#if DTF_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace dtf::libtorch::detail {

/// Whether dtf's memory is on a GPU (a CUDA build).
inline constexpr bool on_gpu = bool(DTF_CUDA);

/// The device dtf's memory is on: the CPU, or (CUDA builds) the current CUDA device.
inline ::torch::Device dtf_device() {
#if DTF_CUDA
  return {::torch::kCUDA, c10::cuda::current_device()};
#else
  return ::torch::kCPU;
#endif
}

/// The options of every from_blob view of dtf's memory (parameters, gradients, inputs, labels,
/// logits): `type` on dtf's device.
inline ::torch::TensorOptions dtf_memory(::torch::ScalarType type = ::torch::kFloat) {
#if DTF_CUDA
  return ::torch::TensorOptions().dtype(type).device(dtf_device());
#else
  return ::torch::TensorOptions().dtype(type);
#endif
}

/// The options of a view of host memory (the has_buffers spans: host vectors on every build).
inline ::torch::TensorOptions host_memory() { return ::torch::TensorOptions().dtype(::torch::kFloat); }

/// "the CPU" or "GPU <n>", for errors naming where a tensor must be.
inline std::string dtf_device_name() { return on_gpu ? "GPU " + std::to_string(int(dtf_device().index())) : "the CPU"; }

/// Waits until dtf's work on the device (its streams' update, gather, copies) is complete, so that
/// LibTorch, on a stream of its own, reads dtf's memory as dtf left it. CPU builds: nothing.
inline void wait_for_dtf() {
#if DTF_CUDA
  if (const cudaError_t rc = cudaDeviceSynchronize(); rc != cudaSuccess)
    throw error(errc::internal, std::string("dtf::libtorch: waiting for dtf's device work: ") + cudaGetErrorString(rc));
#endif
}

/// An event on LibTorch's current CUDA stream, created at its first use and kept (one per model:
/// no creation per step); wait() records it and waits on the host, so that the work LibTorch
/// queued so far (a gradient's accumulation, a copy into dtf's memory) is complete before dtf
/// reads it. A copy starts with no event of its own. CPU builds: nothing to wait for.
class torch_work {
 public:
  torch_work() = default;
  torch_work(const torch_work&) {}
  torch_work& operator=(const torch_work&) { return *this; }
  ~torch_work() {
#if DTF_CUDA
    if (event_) cudaEventDestroy(event_);
#endif
  }
  void wait() {
#if DTF_CUDA
    cudaError_t rc = cudaSuccess;
    if (!event_) rc = cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventRecord(event_, c10::cuda::getCurrentCUDAStream().stream());
    if (rc == cudaSuccess) rc = cudaEventSynchronize(event_);
    if (rc != cudaSuccess)
      throw error(errc::internal, std::string("dtf::libtorch: waiting for LibTorch's stream: ") + cudaGetErrorString(rc));
#endif
  }

 private:
#if DTF_CUDA
  cudaEvent_t event_ = nullptr;
#endif
};

/// t's values (a parameter, a buffer) into n floats of dtf's memory at to: a memcpy on the CPU, a
/// copy on LibTorch's stream on a GPU (the caller waits, torch_work, before dtf reads them).
inline void store(const ::torch::Tensor& t, float* to, std::size_t n) {
  const ::torch::Tensor values = t.detach().contiguous();
  if constexpr (on_gpu)
    ::torch::from_blob(to, {std::int64_t(n)}, dtf_memory()).copy_(values.reshape({-1}));
  else
    std::memcpy(to, values.data_ptr<float>(), n * sizeof(float));
}

/// t's values (a buffer) into n floats of host memory at to (a has_buffers span), complete on return.
inline void store_host(const ::torch::Tensor& t, float* to, std::size_t n) {
  const ::torch::Tensor values = t.to(::torch::kCPU).contiguous();
  std::memcpy(to, values.data_ptr<float>(), n * sizeof(float));
}

/// Zeroes n floats of dtf's memory (the gradient buffer before autograd accumulates into it): on
/// the host on the CPU, on LibTorch's stream on a GPU (ordered before its backward).
inline void zero(float* at, std::size_t n) {
  if constexpr (on_gpu)
    ::torch::from_blob(at, {std::int64_t(n)}, dtf_memory()).zero_();
  else
    std::fill(at, at + n, 0.0f);
}

/// Moves the module to dtf's device (CUDA builds; tied parameters stay tied: Module::to sets each
/// tensor's data in place). CPU builds: nothing.
inline void to_dtf_device([[maybe_unused]] ::torch::nn::Module& module) {
  if constexpr (on_gpu) module.to(dtf_device());
}

}  // namespace dtf::libtorch::detail
