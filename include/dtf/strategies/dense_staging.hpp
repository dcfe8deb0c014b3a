// dtf/strategies/dense_staging.hpp — a model's loss and gradient at host parameters: directly on
// CPU builds (device memory is host memory), staged through device tensors on CUDA builds.
// Used by the workers' gradient computations (dtf/strategies/async.hpp, embedding_gradient.hpp).
//
// CUDA builds (docs/design/gpu-execution.md, section 6.2): one pinned buffer of 2n + 1 floats
// (parameters in, gradient and loss out; cudaHostAlloc, allocated once with the staging) and a
// communication stream of its own. The parameters go to the device with cudaMemcpyAsync on that
// stream and the model's stream waits for an event after the copy; the gradient comes back with
// cudaMemcpyAsync on the communication stream after an event of the model's stream (with the
// loss, when the model left it on the device), and the host waits for that copy only: the push
// sends its bytes. The batch goes in through pinned slots on the model's stream (set_batch,
// device::batch_upload, section 3.1). The model's stream is the compute stream of the context
// it is bound to (detail::takes_context), else the legacy default stream (model_stream()).
// Errors: a failed CUDA call is errc::internal naming it.
// Thread safety: one thread at a time.
#pragma once

#include <dtf/config.hpp>
#include <dtf/device/batch_upload.hpp>
#include <dtf/device/kernels.hpp>  // device::stream_t
#include <dtf/strategies/engine_context.hpp>  // takes_context
#include <dtf/tensor.hpp>

#include <cstddef>
#include <span>
#include <type_traits>

#if DTF_CUDA
#include <dtf/detail/cuda_staging.hpp>  // dtf::detail::check_cuda

#include <cuda_runtime.h>

#include <cstring>
#include <utility>
#endif

namespace dtf::strategies::detail {

/// The stream model m issues its step on: its context's compute stream when it is bound to one,
/// else the legacy default stream (null; always null on CPU builds).
template <class M>
device::stream_t model_stream([[maybe_unused]] const M& m) noexcept {
#if DTF_CUDA
  if constexpr (takes_context<M>)
    if (const device::context* c = m.context()) return c->compute_stream();
#endif
  return {};
}

class dense_staging {
 public:
  explicit dense_staging(std::size_t n) {
    if constexpr (!device_memory_is_host_accessible) {
      params_.resize({n});
      grads_.resize({n});
    }
#if DTF_CUDA
    try {
      using dtf::detail::check_cuda;
      check_cuda(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (dense staging)");
      check_cuda(cudaEventCreateWithFlags(&in_, cudaEventDisableTiming), "cudaEventCreateWithFlags (dense staging)");
      check_cuda(cudaEventCreateWithFlags(&out_, cudaEventDisableTiming), "cudaEventCreateWithFlags (dense staging)");
      void* p = nullptr;
      check_cuda(cudaHostAlloc(&p, (2 * n + 1) * sizeof(float), cudaHostAllocDefault), "cudaHostAlloc (dense staging)");
      pinned_ = static_cast<float*>(p);
    } catch (...) {
      release();
      throw;
    }
#endif
  }
  dense_staging(const dense_staging&) = delete;
  dense_staging& operator=(const dense_staging&) = delete;
#if DTF_CUDA
  ~dense_staging() { release(); }
#endif

  /// Host containers `features` and `labels` (a host_batch's) into device tensors x and y on
  /// `stream` (model_stream(m): the copy precedes the model's step issued there), through pinned
  /// slots; the host waits for `stream` only when a tensor grows past its allocation (device::batch_upload).
  template <class A, class B>
  void set_batch(tensor& x, const A& features, tensor& y, const B& labels, device::stream_t stream = {}) {
    upload_.upload(x, features, y, labels, stream, [stream] {
#if DTF_CUDA
      dtf::detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (dense staging: the batch is resized)");
#else
      (void)stream;
#endif
    });
  }

  /// f(device params, device grads) -> the loss (a float), or a pointer to it in device memory
  /// (host memory on CPU builds: a model's device_loss(), written by the work f issued), called at
  /// host parameters `at`; the gradient lands in the host span g and the loss is returned (a
  /// device loss copied with the gradient: one host wait for both). `stream`: the stream f issues
  /// its work on (model_stream(m); ignored on CPU builds).
  template <class F>
  float operator()(std::span<const float> at, std::span<float> g, F&& f, [[maybe_unused]] device::stream_t stream = {}) {
    constexpr bool loss_on_device = std::is_pointer_v<std::invoke_result_t<F&, std::span<const float>, std::span<float>>>;
    if constexpr (device_memory_is_host_accessible) {
      if constexpr (loss_on_device)
        return *f(at, g);
      else
        return f(at, g);
    } else {
#if DTF_CUDA
      using dtf::detail::check_cuda;
      const std::size_t n = params_.size();
      float* in = pinned_;
      float* out = pinned_ + n;
      // The last call's copies out of and into the buffer completed: it waited for its last copy
      // on the same stream.
      if (n > 0) std::memcpy(in, at.data(), n * sizeof(float));
      check_cuda(cudaMemcpyAsync(params_.data<float>(), in, n * sizeof(float), cudaMemcpyHostToDevice, comm_),
                 "cudaMemcpyAsync (dense staging: parameters)");
      check_cuda(cudaEventRecord(in_, comm_), "cudaEventRecord (dense staging)");
      check_cuda(cudaStreamWaitEvent(stream, in_, 0), "cudaStreamWaitEvent (dense staging: parameters)");
      const auto loss = f(std::span<const float>(params_.span<float>()), grads_.span<float>());
      check_cuda(cudaEventRecord(out_, stream), "cudaEventRecord (dense staging)");
      check_cuda(cudaStreamWaitEvent(comm_, out_, 0), "cudaStreamWaitEvent (dense staging: gradient)");
      check_cuda(cudaMemcpyAsync(out, grads_.data<float>(), n * sizeof(float), cudaMemcpyDeviceToHost, comm_),
                 "cudaMemcpyAsync (dense staging: gradient)");
      if constexpr (loss_on_device)  // the float after the gradient: the same wait covers it
        check_cuda(cudaMemcpyAsync(out + n, loss, sizeof(float), cudaMemcpyDeviceToHost, comm_), "cudaMemcpyAsync (dense staging: loss)");
      check_cuda(cudaStreamSynchronize(comm_), "cudaStreamSynchronize (dense staging: the gradient the push sends)");
      if (n > 0) std::memcpy(g.data(), out, n * sizeof(float));
      if constexpr (loss_on_device)
        return out[n];
      else
        return loss;
#else
      return 0.0f;  // unreachable: without CUDA device memory is host memory
#endif
    }
  }

 private:
#if DTF_CUDA
  void release() noexcept {
    if (comm_) cudaStreamSynchronize(comm_);
    if (pinned_) cudaFreeHost(std::exchange(pinned_, nullptr));
    if (in_) cudaEventDestroy(std::exchange(in_, nullptr));
    if (out_) cudaEventDestroy(std::exchange(out_, nullptr));
    if (comm_) cudaStreamDestroy(std::exchange(comm_, nullptr));
  }
  cudaStream_t comm_{};
  cudaEvent_t in_{}, out_{};  // after the parameters' copy; after the model's step
  float* pinned_ = nullptr;   // [parameters in, gradient out, loss out]
#endif
  tensor params_, grads_;
  device::batch_upload upload_;  // set_batch's slots
};

}  // namespace dtf::strategies::detail
