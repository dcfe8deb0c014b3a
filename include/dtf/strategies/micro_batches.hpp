// dtf/strategies/micro_batches.hpp — micro-batch gradient accumulation for the collective
// strategies (backward_passes_per_step, Horovod's name): a step's batch of B rows runs as k
// backward passes over consecutive micro-batches of about B/k rows each, one after another, and
// the step's gradient and loss are the passes' means weighted by their rows, which is the whole
// batch's mean (the model's loss being a mean over its rows) up to float rounding. The
// optimiser still sees the batch it would without accumulation, at a k-th of the activation
// memory. The passes reuse device buffers kept between steps. check_loop_config: the errors
// of the training-loop knobs the collective strategies share (schedule, clip_norm,
// backward_passes_per_step).
// Thread safety: one thread per instance.
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/config.hpp>
#include <dtf/error.hpp>
#include <dtf/tensor.hpp>

#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <cstddef>
#include <span>
#include <string>

namespace dtf::strategies::detail {

// out = a * x (first pass) or out + a * x (later passes), element-wise.
struct scaled_copy {
  float a;
  DTF_HD float operator()(float x) const { return a * x; }
};
struct scaled_add {
  float a;
  DTF_HD float operator()(float acc, float x) const { return acc + a * x; }
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
      loss += w * l;
      if (i == 0)
        thrust::transform(thrust::device, g.data(), g.data() + g.size(), grads.data(), scaled_copy{w});
      else
        thrust::transform(thrust::device, grads.data(), grads.data() + grads.size(), g.data(), grads.data(),
                          scaled_add{w});
    }
    return loss;
  }

 private:
  int passes_;
  tensor scratch_, x_, y_;
};

}  // namespace dtf::strategies::detail
