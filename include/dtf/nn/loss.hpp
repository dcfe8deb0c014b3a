// dtf/nn/loss.hpp — softmax cross-entropy over logits, and classification accuracy.
#pragma once

#include <dtf/device/kernels.hpp>
#include <dtf/tensor.hpp>

#include <thrust/count.h>
#include <thrust/device_vector.h>
#include <thrust/find.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::nn {

namespace detail {
struct label_out_of_range {
  std::int32_t classes;
  DTF_HD bool operator()(std::int32_t y) const { return y < 0 || y >= classes; }
};

// One row: numerically stable log-sum-exp, the row's loss, and (when grad is not null)
// (softmax - onehot) * scale. A label outside [0, classes) gives the row NaN (see label_check).
struct softmax_xent_row {
  const float* logits;
  const std::int32_t* labels;
  float* grad;
  float* row_loss;
  std::size_t classes;
  float scale;
  DTF_HD void operator()(std::size_t r) const {
    const float* z = logits + r * classes;
    const std::int32_t y = labels[r];
    if (y < 0 || std::size_t(y) >= classes) {  // only with label_check::trusted: never an index
      const float nan = std::numeric_limits<float>::quiet_NaN();
      row_loss[r] = nan;
      if (grad)
        for (std::size_t c = 0; c < classes; ++c) grad[r * classes + c] = nan;
      return;
    }
    float m = z[0];
    for (std::size_t c = 1; c < classes; ++c) m = z[c] > m ? z[c] : m;
    float sum = 0.0f;
    for (std::size_t c = 0; c < classes; ++c) sum += expf(z[c] - m);
    const float log_sum = logf(sum);
    row_loss[r] = log_sum + m - z[y];
    if (grad) {
      float* g = grad + r * classes;
      const float inv = 1.0f / sum;
      for (std::size_t c = 0; c < classes; ++c)
        g[c] = (expf(z[c] - m) * inv - (std::int32_t(c) == y ? 1.0f : 0.0f)) * scale;
    }
  }
};

struct argmax_matches {
  const float* logits;
  const std::int32_t* labels;
  std::size_t classes;
  DTF_HD std::size_t operator()(std::size_t r) const {
    const float* z = logits + r * classes;
    std::size_t best = 0;
    for (std::size_t c = 1; c < classes; ++c)
      if (z[c] > z[best]) best = c;
    return std::int32_t(best) == labels[r] ? 1 : 0;
  }
};

/// Throws unless labels are int32 with one per row (host metadata only).
inline void check_label_shape(const tensor& labels, std::size_t rows, const char* who) {
  if (labels.type() != dtype::int32)
    throw error(errc::invalid_argument, std::string(who) + ": labels must be int32, got " +
                                            std::string(name_of(labels.type())));
  if (labels.size() != rows)
    throw error(errc::shape_mismatch, std::string(who) + ": " + std::to_string(labels.size()) + " labels for " +
                                          std::to_string(rows) + " rows of logits");
}

/// Throws naming the first label outside [0, classes) (and as check_label_shape).
inline void check_labels(const tensor& labels, std::size_t rows, std::size_t classes, const char* who) {
  check_label_shape(labels, rows, who);
  std::size_t at = rows;
  std::int32_t value = 0;
#if DTF_CUDA
  auto first = labels.device_ptr<std::int32_t>();
  auto bad = thrust::find_if(first, first + rows, label_out_of_range{std::int32_t(classes)});
  if (bad != first + rows) {
    value = *bad;
    at = std::size_t(bad - first);
  }
#else
  const std::int32_t* y = labels.data<std::int32_t>();
  const label_out_of_range outside{std::int32_t(classes)};
  for (std::size_t r = 0; r < rows && at == rows; ++r)
    if (outside(y[r])) {
      value = y[r];
      at = r;
    }
#endif
  if (at != rows)
    throw error(errc::out_of_range, std::string(who) + ": label " + std::to_string(value) + " at row " +
                                        std::to_string(at) + " is outside [0, " + std::to_string(classes) + ")");
}

inline std::pair<std::size_t, std::size_t> logits_shape(const tensor& logits, const char* who) {
  if (logits.type() != dtype::float32 || logits.rank() != 2)
    throw error(errc::shape_mismatch, std::string(who) + ": logits must be float32 [batch, classes], got " +
                                          std::string(name_of(logits.type())) + " " + to_string(logits.shape()));
  return {logits.dim(0), logits.dim(1)};
}
}  // namespace detail

/// Whether softmax_cross_entropy checks the labels before it reads them.
enum class label_check {
  /// Each label is checked to be in [0, classes): an error names the first that is not. On CUDA
  /// builds this is a search on the device whose answer is read by the host (a blocking call).
  verify,
  /// The caller vouches for the labels: they were checked when they reached the device
  /// (data::device_shard checks every label at upload, and its gather only permutes them), so
  /// the step reads nothing back. Their type and count are still checked (host metadata). A
  /// label outside [0, classes) all the same is never used as an index: its row's loss and
  /// gradient are NaN, so the mean loss is NaN and the NaN hooks stop the run.
  trusted,
};

/// Softmax cross-entropy with integer labels (TensorFlow's
/// sparse_softmax_cross_entropy_with_logits, averaged over the batch). Holds a per-row
/// workspace and the mean loss in device memory, so one instance serves one thread at a time.
///
/// CUDA builds: one kernel writes the gradient and each row's loss, a second (one block, a fixed
/// order, device::mean_of) writes the mean into a device scalar; both on stream() (the legacy
/// default stream unless set_stream() names another). The workspace grows with the largest
/// batch seen and is otherwise kept, so a steady step allocates nothing. enqueue() leaves the
/// loss on the device (device_loss()); operator() also reads it (one blocking copy).
/// CPU builds: one sequential pass on the calling thread, the arithmetic of every earlier
/// release (the same bits).
class softmax_cross_entropy {
 public:
  /// Mean loss over the rows of logits [batch, classes] with labels [batch] (int32 in
  /// [0, classes)); when grad is not null writes d loss / d logits into it.
  /// Errors: errc::out_of_range naming the first bad label; errc::shape_mismatch.
  float operator()(const tensor& logits, const tensor& labels, tensor* grad) {
    enqueue(logits, labels, grad, label_check::verify);
    return read_loss();
  }

  /// The same without reading the loss back: the mean is written into device_loss() (and the
  /// gradient into grad) by work issued on stream(). With label_check::trusted nothing on the
  /// way blocks the host (see label_check). Errors: as operator(); errc::invalid_argument for a
  /// label tensor that is not int32.
  void enqueue(const tensor& logits, const tensor& labels, tensor* grad, label_check check = label_check::verify) {
    const auto [rows, classes] = detail::logits_shape(logits, "nn::softmax_cross_entropy");
    if (check == label_check::verify) {
#if DTF_CUDA
      // The check searches on the legacy stream: labels written on another stream must be there.
      if (stream_ != nullptr && stream_ != cudaStreamLegacy)
        if (const cudaError_t rc = cudaStreamSynchronize(stream_); rc != cudaSuccess)
          throw error(errc::internal, std::string("nn::softmax_cross_entropy: ") + cudaGetErrorString(rc));
#endif
      detail::check_labels(labels, rows, classes, "nn::softmax_cross_entropy");
    } else {
      detail::check_label_shape(labels, rows, "nn::softmax_cross_entropy");
    }
    float* g = nullptr;
    if (grad && rows != 0) {
      const dims& gs = grad->shape();  // rebuilt only when it changes: a steady step allocates nothing
      if (grad->type() != dtype::float32 || gs.size() != 2 || gs[0] != rows || gs[1] != classes)
        grad->resize({rows, classes}, dtype::float32);
      g = grad->data<float>();
    }
#if !DTF_CUDA
    host_loss_ = host_pass(logits.data<float>(), labels.data<std::int32_t>(), g, rows, classes);
#else
    if (loss_.empty()) loss_.resize(1);
    if (row_loss_.size() < rows) row_loss_.resize(rows);
    float* row_loss = thrust::raw_pointer_cast(row_loss_.data());
    if (rows != 0)
      device::for_each_index(stream_, rows,
                             detail::softmax_xent_row{logits.data<float>(), labels.data<std::int32_t>(), g, row_loss,
                                                      classes, 1.0f / float(rows)},
                             "nn::softmax_cross_entropy (rows)");
    device::mean_of(stream_, row_loss, rows, thrust::raw_pointer_cast(loss_.data()));
#endif
  }

  /// The mean loss of the last enqueue(), in device memory (host memory on CPU builds), written
  /// by work on stream(): read it after that work (an event, or the stream's order). Null on
  /// CUDA builds before the first enqueue; the address is stable after it.
  const float* device_loss() const noexcept {
#if DTF_CUDA
    return loss_.empty() ? nullptr : thrust::raw_pointer_cast(loss_.data());
#else
    return &host_loss_;
#endif
  }

  /// The mean loss of the last enqueue(), read to the host (CUDA builds: waits for stream()).
  /// Errors: errc::internal when the copy fails; errc::invalid_argument before any enqueue().
  float read_loss() const {
#if DTF_CUDA
    if (loss_.empty()) throw error(errc::invalid_argument, "nn::softmax_cross_entropy: no loss computed yet");
    float v = 0.0f;
    cudaError_t rc = cudaMemcpyAsync(&v, thrust::raw_pointer_cast(loss_.data()), sizeof v, cudaMemcpyDeviceToHost, stream_);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream_);
    if (rc != cudaSuccess)
      throw error(errc::internal, std::string("nn::softmax_cross_entropy: reading the loss: ") + cudaGetErrorString(rc));
    return v;
#else
    return host_loss_;
#endif
  }

  /// The stream the kernels are issued on (CUDA builds; 0, the legacy default stream, unless set).
  device::stream_t stream() const noexcept { return stream_; }
  /// Issues later work on s (e.g. a device::context's compute stream). The logits must be
  /// written by work ordered before it on s (the same stream, or an event s waits for).
  void set_stream(device::stream_t s) noexcept { stream_ = s; }

 private:
#if !DTF_CUDA
  // One sequential pass on the host: the same per-row arithmetic, summed in row order. A label
  // outside [0, classes) (only reachable with label_check::trusted) gives its row NaN.
  static float host_pass(const float* z, const std::int32_t* y, float* g, std::size_t rows, std::size_t classes) {
    if (rows == 0) return 0.0f;
    float total = 0.0f;
    const float scale = 1.0f / float(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* zr = z + r * classes;
      if (y[r] < 0 || std::size_t(y[r]) >= classes) {
        if (g) std::fill(g + r * classes, g + (r + 1) * classes, std::numeric_limits<float>::quiet_NaN());
        total += std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      float m = zr[0];
      for (std::size_t c = 1; c < classes; ++c) m = zr[c] > m ? zr[c] : m;
      float sum = 0.0f;
      if (g) {
        float* gr = g + r * classes;
        for (std::size_t c = 0; c < classes; ++c) sum += (gr[c] = expf(zr[c] - m));
        const float inv = 1.0f / sum;
        for (std::size_t c = 0; c < classes; ++c) gr[c] = (gr[c] * inv - (std::int32_t(c) == y[r] ? 1.0f : 0.0f)) * scale;
      } else {
        for (std::size_t c = 0; c < classes; ++c) sum += expf(zr[c] - m);
      }
      total += logf(sum) + m - zr[y[r]];
    }
    return total / float(rows);
  }
  float host_loss_ = 0.0f;
#else
  thrust::device_vector<float> row_loss_;  // per-row losses, grown with the largest batch
  thrust::device_vector<float> loss_;      // the mean (one float, allocated at the first enqueue)
#endif
  device::stream_t stream_{};
};

/// Number of rows whose largest logit is at the label's index.
inline std::size_t count_correct(const tensor& logits, const tensor& labels) {
  const auto [rows, classes] = detail::logits_shape(logits, "nn::count_correct");
  detail::check_labels(labels, rows, classes, "nn::count_correct");
#if !DTF_CUDA
  const detail::argmax_matches match{logits.data<float>(), labels.data<std::int32_t>(), classes};
  std::size_t n = 0;
  for (std::size_t r = 0; r < rows; ++r) n += match(r);
  return n;
#else
  return thrust::transform_reduce(thrust::counting_iterator<std::size_t>(0),
                                  thrust::counting_iterator<std::size_t>(rows),
                                  detail::argmax_matches{logits.data<float>(), labels.data<std::int32_t>(), classes},
                                  std::size_t{0}, thrust::plus<std::size_t>());
#endif
}

}  // namespace dtf::nn
