// dtf/strategies/micro_batches.hpp — micro-batch gradient accumulation for the collective
// strategies (backward_passes_per_step, Horovod's name): a step's batch of B rows runs as k
// backward passes over consecutive micro-batches of about B/k rows each, one after another, and
// the step's gradient and loss are the passes' means weighted by their rows, which is the whole
// batch's mean (the model's loss being a mean over its rows) up to float rounding. The
// optimiser still sees the batch it would without accumulation, at a k-th of the activation
// memory. The passes reuse device buffers kept between steps. check_loop_config: the errors
// of the training-loop knobs the collective strategies share (schedule, clip_norm,
// backward_passes_per_step).
// Two forms: loss_and_gradients (any model) reads each pass's loss on the host and slices the
// batch with Thrust's blocking policy (CUDA builds: the caller waits for the model's stream
// first); enqueue_loss_and_gradients (a model that defers its loss, dtf::defers_loss, whose work
// is on the given stream, e.g. nn::sequential bound to a training engine's context) issues every
// pass's row copies, the accumulation of its gradient and of its loss (a kernel adding
// w * device_loss() into a device scalar, device_loss() here) on that stream, and reads nothing:
// the host waits for the stream when a pass's buffers grow (the first step, a larger batch; an
// epoch's short last batch only reshapes them); a model that grows its own buffers waits for its
// stream itself (nn::sequential: on its first step and a larger batch, so none per step, even
// with uneven passes, 10 rows in 3: 3, 3, 4). Both compute the same floats in the same order (CPU
// builds: the same bits, tests/test_collectives.cpp; device code adds w * x without contracting
// it into a fused multiply-add, as the host does).
// Thread safety: one thread per instance.
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/config.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>
#include <dtf/tensor.hpp>

#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::strategies::detail {

// acc + a * x, rounded after the product and after the sum as the host computes it (device code
// would otherwise contract it into a fused multiply-add, rounded once).
DTF_HD inline float add_product(float acc, float a, float x) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(acc, __fmul_rn(a, x));
#else
  return acc + a * x;
#endif
}
// out = a * x (first pass) or out + a * x (later passes), element-wise.
struct scaled_copy {
  float a;
  DTF_HD float operator()(float x) const { return a * x; }
};
struct scaled_add {
  float a;
  DTF_HD float operator()(float acc, float x) const { return add_product(acc, a, x); }
};
// The same over device memory, one thread per element: out[i] = a * x[i] (first) or
// out[i] + a * x[i]; for the loss, one element: out[0] = (first ? 0 : out[0]) + a * x[0], the
// host's `loss += w * l` from loss = 0.
struct accumulate_scaled {
  float* out;
  const float* x;
  float a;
  bool first;
  DTF_HD void operator()(std::size_t i) const { out[i] = first ? a * x[i] : add_product(out[i], a, x[i]); }
};
struct accumulate_loss {
  float* out;
  const float* x;
  float a;
  bool first;
  DTF_HD void operator()(std::size_t) const { out[0] = add_product(first ? 0.0f : out[0], a, x[0]); }
};

/// Errors of the training-loop knobs every collective strategy shares (errc::invalid_config).
template <class Config>
void check_loop_config(const Config& c, const char* who) {
  if (!(c.clip_norm >= 0.0f))
    throw error(errc::invalid_config, std::string(who) + ": clip_norm " + std::to_string(c.clip_norm) +
                                          " (must be 0, off, or positive)");
  if (c.backward_passes_per_step < 1)
    throw error(errc::invalid_config, std::string(who) + ": backward_passes_per_step " +
                                          std::to_string(c.backward_passes_per_step) + " (must be at least 1)");
  if (c.schedule && c.linear_scaling)
    throw error(errc::invalid_config, std::string(who) + ": a schedule and linear_scaling together (fold the "
                                                         "scaling into the schedule)");
}

/// Rows [begin, begin + count) of device tensor x (first dimension: rows) copied into out.
inline void copy_rows(const tensor& x, std::size_t begin, std::size_t count, tensor& out) {
  dims shape = x.shape();
  const std::size_t rows = shape.at(0), row_bytes = rows ? x.size_bytes() / rows : 0;
  shape[0] = count;
  out.resize(shape, x.type());
  const auto src = x.bytes().subspan(begin * row_bytes, count * row_bytes);
  thrust::copy(thrust::device, src.data(), src.data() + src.size(), out.bytes().data());
}

/// The k passes of a step (see the file comment).
class micro_batches {
 public:
  /// Passes of a step. Errors: errc::invalid_config when passes is 0.
  explicit micro_batches(int passes) : passes_(passes) {
    if (passes < 1)
      throw error(errc::invalid_config, "backward_passes_per_step: " + std::to_string(passes) + " (must be at least 1)");
  }
  /// Backward passes per step.
  int passes() const noexcept { return passes_; }

  /// The loss of batch (x, y) at params and its gradient in `grads` (device memory), computed
  /// in passes() passes of model m. Errors: errc::invalid_argument when the batch has fewer
  /// rows than passes; the model's.
  template <model M>
  float loss_and_gradients(M& m, std::span<const float> params, const tensor& x, const tensor& y,
                           std::span<float> grads) {
    const std::size_t rows = x.shape().empty() ? 0 : x.dim(0), k = std::size_t(passes_);
    if (rows < k)
      throw error(errc::invalid_argument, "backward_passes_per_step " + std::to_string(k) + ": a batch of " +
                                              std::to_string(rows) + " rows cannot be cut into as many micro-batches");
    if (scratch_.size() != grads.size()) scratch_.resize({grads.size()});
    const auto g = scratch_.span<float>();
    float loss = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t begin = rows * i / k, end = rows * (i + 1) / k;
      copy_rows(x, begin, end - begin, x_);
      copy_rows(y, begin, end - begin, y_);
      const float l = m.loss_and_gradients(params, x_, y_, g);
      const float w = float(double(end - begin) / double(rows));
      loss = add_product(loss, w, l);
      if (i == 0)
        thrust::transform(thrust::device, g.data(), g.data() + g.size(), grads.data(), scaled_copy{w});
      else
        thrust::transform(thrust::device, grads.data(), grads.data() + grads.size(), g.data(), grads.data(),
                          scaled_add{w});
    }
    return loss;
  }

  /// The same passes with no host read, for a model that defers its loss and issues its work on
  /// `stream` (see the file comment): the gradient in `grads`, the loss left at device_loss(),
  /// both written by work on `stream`. Errors: those of loss_and_gradients.
  template <defers_loss M>
  void enqueue_loss_and_gradients(M& m, std::span<const float> params, const tensor& x, const tensor& y,
                                  std::span<float> grads, device::stream_t stream) {
    const std::size_t rows = x.shape().empty() ? 0 : x.dim(0), k = std::size_t(passes_);
    if (rows < k)
      throw error(errc::invalid_argument, "backward_passes_per_step " + std::to_string(k) + ": a batch of " +
                                              std::to_string(rows) + " rows cannot be cut into as many micro-batches");
    shape_passes(x, y, grads.size(), stream);
    const auto g = scratch_.span<float>();
    float* loss = loss_.data<float>();
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t begin = rows * i / k, end = rows * (i + 1) / k;
      copy_rows_on(stream, x, begin, xs_[i]);
      copy_rows_on(stream, y, begin, ys_[i]);
      m.enqueue_loss_and_gradients(params, xs_[i], ys_[i], g);
      const float w = float(double(end - begin) / double(rows));
      device::for_each_index(stream, 1, accumulate_loss{loss, m.device_loss(), w, i == 0}, "micro_batches (loss)");
      device::for_each_index(stream, g.size(), accumulate_scaled{grads.data(), g.data(), w, i == 0},
                             "micro_batches (gradient)");
    }
  }
  /// The last enqueue_loss_and_gradients' loss (device memory; host memory on CPU builds).
  const float* device_loss() const { return loss_.data<float>(); }

 private:
  // The device form's buffers shaped for batch (x, y): pass i's rows, the pass's gradient, the
  // loss. Reshaping within their allocations touches no memory (tensor::resize); growing them
  // does, on the legacy stream (Thrust), so the host waits for `stream` first when one grows
  // (the first step, a larger batch: never in a steady state, nor at an epoch's short batch).
  void shape_passes(const tensor& x, const tensor& y, std::size_t n, device::stream_t stream) {
    const std::size_t rows = x.dim(0), k = std::size_t(passes_);
    std::vector<dims> xd(k), yd(k);
    bool same = xs_.size() == k && scratch_.size() == n && loss_.size() == 1;
    for (std::size_t i = 0; i < k; ++i) {
      xd[i] = x.shape(), yd[i] = y.shape();
      xd[i][0] = yd[i][0] = rows * (i + 1) / k - rows * i / k;
      same = same && xs_[i].shape() == xd[i] && xs_[i].type() == x.type() && ys_[i].shape() == yd[i] &&
             ys_[i].type() == y.type();
    }
    if (same) return;
    bool grows = xs_.size() != k || scratch_.capacity_bytes() < n * sizeof(float) || loss_.capacity_bytes() < sizeof(float);
    for (std::size_t i = 0; i < k && !grows; ++i)
      grows = xs_[i].capacity_bytes() < num_elements(xd[i]) * size_of(x.type()) ||
              ys_[i].capacity_bytes() < num_elements(yd[i]) * size_of(y.type());
    if (grows) wait(stream);
    xs_.resize(k), ys_.resize(k);
    for (std::size_t i = 0; i < k; ++i) xs_[i].resize(xd[i], x.type()), ys_[i].resize(yd[i], y.type());
    scratch_.resize({n});
    loss_.resize({1}, dtype::float32);
  }
  // The host waits for the work issued on `stream` so far (no-op on CPU builds).
  static void wait(device::stream_t stream) {
#if DTF_CUDA
    if (const cudaError_t rc = cudaStreamSynchronize(stream); rc != cudaSuccess)
      throw error(errc::internal, std::string("micro_batches: waiting for the stream: ") + cudaGetErrorString(rc));
#else
    (void)stream;
#endif
  }
  // Rows [begin, begin + out's rows) of x into out (shaped), on `stream`.
  static void copy_rows_on(device::stream_t stream, const tensor& x, std::size_t begin, tensor& out) {
    const std::size_t row_bytes = x.dim(0) ? x.size_bytes() / x.dim(0) : 0;
    const auto src = x.bytes().subspan(begin * row_bytes, out.size_bytes());
    if (src.empty()) return;
#if DTF_CUDA
    if (const cudaError_t rc = cudaMemcpyAsync(out.bytes().data(), src.data(), src.size(), cudaMemcpyDeviceToDevice, stream);
        rc != cudaSuccess)
      throw error(errc::internal, std::string("micro_batches: copying a micro-batch: ") + cudaGetErrorString(rc));
#else
    (void)stream;
    std::memcpy(out.bytes().data(), src.data(), src.size());
#endif
  }

  int passes_;
  tensor scratch_, x_, y_;
  std::vector<tensor> xs_, ys_;  // the device form's passes
  tensor loss_;                  // the device form's loss
};

}  // namespace dtf::strategies::detail
