// dtf/nn/loss.hpp — softmax cross-entropy over logits, and classification accuracy.
#pragma once

#include <dtf/tensor.hpp>

#include <thrust/count.h>
#include <thrust/device_vector.h>
#include <thrust/find.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/reduce.h>
#include <thrust/transform_reduce.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dtf::nn {

namespace detail {
struct label_out_of_range {
  std::int32_t classes;
  DTF_HD bool operator()(std::int32_t y) const { return y < 0 || y >= classes; }
};

// One row: numerically stable log-sum-exp, the row's loss, and (when grad is not null)
// (softmax - onehot) * scale.
struct softmax_xent_row {
  const float* logits;
  const std::int32_t* labels;
  float* grad;
  float* row_loss;
  std::size_t classes;
  float scale;
  DTF_HD void operator()(std::size_t r) const {
    const float* z = logits + r * classes;
    float m = z[0];
    for (std::size_t c = 1; c < classes; ++c) m = z[c] > m ? z[c] : m;
    float sum = 0.0f;
    for (std::size_t c = 0; c < classes; ++c) sum += expf(z[c] - m);
    const float log_sum = logf(sum);
    const std::int32_t y = labels[r];
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

/// Throws naming the first label outside [0, classes).
inline void check_labels(const tensor& labels, std::size_t rows, std::size_t classes, const char* who) {
  if (labels.type() != dtype::int32)
    throw error(errc::invalid_argument, std::string(who) + ": labels must be int32, got " +
                                            std::string(name_of(labels.type())));
  if (labels.size() != rows)
    throw error(errc::shape_mismatch, std::string(who) + ": " + std::to_string(labels.size()) + " labels for " +
                                          std::to_string(rows) + " rows of logits");
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

/// Softmax cross-entropy with integer labels (TensorFlow's
/// sparse_softmax_cross_entropy_with_logits, averaged over the batch). Holds a per-row
/// workspace, so one instance serves one thread at a time.
class softmax_cross_entropy {
 public:
  /// Mean loss over the rows of logits [batch, classes] with labels [batch] (int32 in
  /// [0, classes)); when grad is not null writes d loss / d logits into it.
  /// Errors: errc::out_of_range naming the first bad label; errc::shape_mismatch.
  float operator()(const tensor& logits, const tensor& labels, tensor* grad) {
    const auto [rows, classes] = detail::logits_shape(logits, "nn::softmax_cross_entropy");
    detail::check_labels(labels, rows, classes, "nn::softmax_cross_entropy");
    if (rows == 0) return 0.0f;
    float* g = nullptr;
    if (grad) {
      grad->resize({rows, classes}, dtype::float32);
      g = grad->data<float>();
    }
#if !DTF_CUDA
    // One sequential pass on the host: the same per-row arithmetic, summed in row order.
    const float* z = logits.data<float>();
    const std::int32_t* y = labels.data<std::int32_t>();
    float total = 0.0f;
    const float scale = 1.0f / float(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* zr = z + r * classes;
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
#else
    if (row_loss_.size() < rows) row_loss_.resize(rows);
    float* row_loss = thrust::raw_pointer_cast(row_loss_.data());
    thrust::for_each(thrust::counting_iterator<std::size_t>(0), thrust::counting_iterator<std::size_t>(rows),
                     detail::softmax_xent_row{logits.data<float>(), labels.data<std::int32_t>(), g, row_loss,
                                              classes, 1.0f / float(rows)});
    const float total = thrust::reduce(row_loss_.begin(), row_loss_.begin() + std::ptrdiff_t(rows), 0.0f);
    return total / float(rows);
#endif
  }

 private:
  thrust::device_vector<float> row_loss_;
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
