// examples/recommender/model.hpp — a DLRM-style click model (Naumov et al. 2019) with a wide part
// (Wide & Deep, Cheng et al. 2016; here a factorization machine, as DeepFM) over the Criteo
// columns, its embedding rows in a hashed table on the ps; models dtf::embedding_classifier.
//
// Input (a data::dataset's features, floats): per example the 13 numeric features
// (criteo_dense_value), then each of the 26 categorical ids as 4 floats of 16 bits each: a float
// holds an integer exactly only below 2^24, a 64-bit hash in 4 pieces (to_dataset()).
// The model, for an example with numeric features x and ids c_1..c_26:
//   e_i, b_i  the row of c_i in the hashed table "categorical" (D + 1 floats): its embedding e_i
//           (D) and its own weight b_i (the last float). One table for the 26 columns: criteo_id
//           salts every id with its column, so two columns never share a row, and a step
//           gathers from each ps once instead of 26 times. A missing field (id 0) has a row of
//           its own, learnt like the others.
//   z       [x (13) | e_1..e_26 (26 D) | <e_i, e_j> for i < j (325)]: DLRM's dot interactions,
//           since a click log's signal is largely pairwise (this user's features with this
//           ad's), which an MLP over the concatenation alone learns slowly. DLRM's bottom MLP
//           over x is left out: x enters the top MLP directly.
//   deep    the top MLP over z (ReLU layers, then 1 output).
//   logit   deep + Σ_i b_i + <w, x> + Σ_{i<j} <e_i, e_j>: the wide part, a factorization
//           machine straight to the logit (DeepFM, Guo et al. 2017: the deep part and the FM
//           share the rows): each id's own effect, the numeric features' linear one and the
//           pairs' sum. Without it an id's effect and the pairs reach the logit only through
//           the MLP, which must find them: on synthetic logs, whose planted logit has exactly
//           these terms (dtf/data/criteo_synthetic.hpp), the model without the wide part
//           reached AUC 0.73-0.74 against the planted 0.81 (180,000 lines of vocabulary 100),
//           and without the pairs' sum only a linear model's (rows starting near 0 give the
//           MLP's dot inputs too little signal to grow); docs/benchmarks/recommender.md.
//   loss    p(click) = sigmoid(logit), the mean binary cross-entropy of p (one logit, as
//           dtf/metrics/binary_eval.hpp reads it).
// Dense variables: the top MLP's ("dense_<i>/kernel", "dense_<i>/bias"), then "wide/kernel"
// [13, 1] (w; the last layer's bias is the logit's). Thread safety: one instance per thread.
#pragma once

#include <dtf/data/criteo.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/nn/layers.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace examples::recommender {

using dtf::data::criteo_categorical_columns;
using dtf::data::criteo_dense_columns;

inline constexpr std::size_t id_pieces = 4;  // 16-bit pieces of a 64-bit id
inline constexpr std::size_t feature_width = criteo_dense_columns + criteo_categorical_columns * id_pieces;
inline constexpr std::size_t num_pairs = criteo_categorical_columns * (criteo_categorical_columns - 1) / 2;

/// Examples [begin, end) of `cols` as a dataset in the model's input layout (file comment).
inline dtf::data::dataset to_dataset(const dtf::data::criteo_columns& cols, std::size_t begin, std::size_t end) {
  const std::size_t n = end - begin;
  xt::xtensor<float, 2> features = xt::zeros<float>({n, feature_width});
  xt::xtensor<std::int32_t, 1> labels = xt::zeros<std::int32_t>({n});
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t i = begin + r;
    labels(r) = cols.labels[i] != 0.0f ? 1 : 0;
    for (std::size_t j = 0; j < criteo_dense_columns; ++j) features(r, j) = cols.dense[i * criteo_dense_columns + j];
    for (std::size_t c = 0; c < criteo_categorical_columns; ++c) {
      const std::uint64_t id = cols.ids[i * criteo_categorical_columns + c];
      for (std::size_t k = 0; k < id_pieces; ++k)
        features(r, criteo_dense_columns + c * id_pieces + k) = float((id >> (16 * k)) & 0xffff);
    }
  }
  return dtf::data::dataset(std::move(features), std::move(labels), 0.0f, 65535.0f);
}

/// The model's shape.
struct dlrm_config {
  std::uint32_t dim = 8;             ///< D: floats per embedding (a row holds D + 1: the id's weight)
  std::vector<std::size_t> hidden{64, 32};  ///< the top MLP's ReLU layers
  std::uint64_t max_rows = std::uint64_t(1) << 22;  ///< rows the hashed table holds at most
  std::uint64_t evict_after = 0;     ///< evict rows unseen for this many shard updates (0: never)
  float init_scale = 0.05f;          ///< rows start uniform in [-init_scale, init_scale]
};

class dlrm {
 public:
  explicit dlrm(const dlrm_config& c) : c_(c), top_(top_layers(c)) {
    for (std::size_t i = 0; i < top_.size(); ++i) {
      offsets_.push_back(num_parameters_);
      const auto v = top_[i].variables("dense_" + std::to_string(i), num_parameters_);
      variables_.insert(variables_.end(), v.begin(), v.end());
      num_parameters_ += top_[i].num_parameters();
    }
    variables_.push_back({"wide/kernel", {criteo_dense_columns, 1}, num_parameters_});
    num_parameters_ += criteo_dense_columns;
    acts_.resize(top_.size());
    grads_.resize(top_.size());
  }

  std::vector<dtf::variable_spec> variables() const { return variables_; }
  std::vector<dtf::embedding_spec> embeddings() const {
    dtf::embedding_spec t;
    t.name = "categorical";
    t.rows = 0;  // hashed: any 64-bit id, a row made on first use
    t.dim = c_.dim + 1;
    t.init.scale = c_.init_scale;
    t.max_rows = c_.max_rows;
    t.evict_after = c_.evict_after;
    return {t};
  }
  std::size_t num_parameters() const noexcept { return num_parameters_; }
  /// The MLP as nn::sequential starts it (He before a ReLU, Glorot before the logit); w at 0.
  void initialize(std::span<float> p, std::uint64_t seed) const {
    check_size(p, "parameter");
    dtf::nn::splitmix64 seeds(seed);
    for (std::size_t i = 0; i < top_.size(); ++i)
      top_[i].initialize(p.subspan(offsets_[i], top_[i].num_parameters()), seeds(), i + 1 < top_.size());
    const std::vector<float> zeros(criteo_dense_columns, 0.0f);
    thrust::copy(zeros.begin(), zeros.end(), thrust::device_pointer_cast(p.data() + wide_offset()));
  }

  /// The 26 ids of every example of b, row by row. Errors: shape_mismatch for another feature
  /// width; invalid_argument naming the example and column for a piece that is not 16 bits.
  void embedding_ids(const dtf::data::host_batch& b, std::size_t table, std::vector<std::uint64_t>& ids) const {
    if (table != 0) throw dtf::error(dtf::errc::out_of_range, "recommender::dlrm: table " + std::to_string(table) + " of 1");
    const std::size_t n = b.features.shape(0);
    if (b.features.shape(1) != feature_width)
      throw dtf::error(dtf::errc::shape_mismatch, "recommender::dlrm: a batch of " + std::to_string(b.features.shape(1)) +
                                                      " features, the model reads " + std::to_string(feature_width));
    ids.resize(n * criteo_categorical_columns);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t c = 0; c < criteo_categorical_columns; ++c) {
        std::uint64_t id = 0;
        for (std::size_t k = 0; k < id_pieces; ++k) {
          const float v = b.features(r, criteo_dense_columns + c * id_pieces + k);
          if (!(v >= 0.0f && v <= 65535.0f) || std::floor(v) != v)
            throw dtf::error(dtf::errc::invalid_argument, "recommender::dlrm: example " + std::to_string(r) + ", C" +
                                                              std::to_string(c + 1) + ": piece " + std::to_string(v) +
                                                              " is not a 16-bit part of an id");
          id |= std::uint64_t(v) << (16 * k);
        }
        ids[r * criteo_categorical_columns + c] = id;
      }
  }

  /// The batch's mean binary cross-entropy; d loss / d p into g, d loss / d row into rows[0].grads
  /// (summed over the row's uses). Errors: invalid_argument for labels that are not int32 0 or 1.
  float loss_and_gradients(std::span<const float> p, std::span<const dtf::embedding_rows> rows, const dtf::tensor& x,
                           const dtf::tensor& y, std::span<float> g) {
    check_size(g, "gradient");
    forward(p, rows, x);
    labels_.resize(n_);
    if (y.type() != dtf::dtype::int32 || y.size() != n_)
      throw dtf::error(dtf::errc::invalid_argument, "recommender::dlrm: labels must be " + std::to_string(n_) + " int32");
    y.copy_to_host<std::int32_t>(std::span<std::int32_t>(labels_));
    // loss = mean softplus(t) − y t; d loss / d t = (sigmoid(t) − y) / n.
    double loss = 0;
    for (std::size_t e = 0; e < n_; ++e) {
      if (labels_[e] != 0 && labels_[e] != 1)
        throw dtf::error(dtf::errc::invalid_argument, "recommender::dlrm: example " + std::to_string(e) + ": label " +
                                                          std::to_string(labels_[e]) + " is not 0 or 1");
      const float t = logit_[e];
      loss += std::max(t, 0.0f) - t * float(labels_[e]) + std::log1p(std::exp(-std::abs(t)));
      logit_[e] = (1.0f / (1.0f + std::exp(-t)) - float(labels_[e])) / float(n_);  // now d loss / d t
    }
    // Back through the MLP; its input's gradient is d loss / d z.
    grads_.back().resize({n_, 1}, dtf::dtype::float32);
    grads_.back().copy_from_host<float>(std::span<const float>(logit_));
    for (std::size_t i = top_.size(); i-- > 0;) {
      const dtf::tensor& in = i == 0 ? input_ : acts_[i - 1];
      dtf::tensor* dx = i == 0 ? &input_grad_ : &grads_[i - 1];
      if (i + 1 < top_.size())
        top_[i].backward_relu(p.data() + offsets_[i], in, acts_[i], grads_[i], g.data() + offsets_[i], dx);
      else
        top_[i].backward(p.data() + offsets_[i], in, grads_[i], g.data() + offsets_[i], dx);
    }
    dz_.resize(input_grad_.size());
    input_grad_.copy_to_host<float>(std::span<float>(dz_));
    // d loss / d w = Σ_e dt_e x_e.
    std::vector<float> dw(criteo_dense_columns, 0.0f);
    for (std::size_t e = 0; e < n_; ++e)
      for (std::size_t j = 0; j < criteo_dense_columns; ++j) dw[j] += logit_[e] * xh_[e * feature_width + j];
    thrust::copy(dw.begin(), dw.end(), thrust::device_pointer_cast(g.data() + wide_offset()));
    // d loss / d e_i = the concatenation's slot + Σ_{j≠i} d loss / d<e_i, e_j> · e_j (the MLP's
    // d loss / d<e_i, e_j> plus dt, the FM sum's), and d loss / d b_i = dt; summed over every
    // use of a row (the model writes rows[0].grads whole).
    const auto& r = rows[0];
    std::fill(r.grads.begin(), r.grads.end(), 0.0f);
    const std::size_t D = c_.dim, C = criteo_categorical_columns, W = width();
    for (std::size_t e = 0; e < n_; ++e) {
      const float* dze = dz_.data() + e * W;
      const float* dpair = dze + criteo_dense_columns + C * D;
      for (std::size_t i = 0; i < C; ++i) {
        float* gi = r.grads.data() + std::size_t(r.index[e * C + i]) * (D + 1);
        const float* dcat = dze + criteo_dense_columns + i * D;
        for (std::size_t k = 0; k < D; ++k) gi[k] += dcat[k];
        gi[D] += logit_[e];
        for (std::size_t j = 0; j < C; ++j) {
          if (j == i) continue;
          const float d = dpair[pair_index(std::min(i, j), std::max(i, j))] + logit_[e];  // the MLP's and the FM sum's
          const float* ej = row(r, e, j);
          for (std::size_t k = 0; k < D; ++k) gi[k] += d * ej[k];
        }
      }
    }
    return float(loss / double(n_));
  }

  /// The logit of every example into out [batch, 1].
  void logits(std::span<const float> p, std::span<const dtf::embedding_rows> rows, const dtf::tensor& x,
              dtf::tensor& out) {
    forward(p, rows, x);
    out.resize({n_, 1}, dtf::dtype::float32);
    out.copy_from_host<float>(std::span<const float>(logit_));
  }

 private:
  static std::vector<dtf::nn::dense> top_layers(const dlrm_config& c) {
    if (c.dim == 0) throw dtf::error(dtf::errc::invalid_argument, "recommender::dlrm: dim must be positive");
    std::vector<dtf::nn::dense> layers;
    std::size_t in = criteo_dense_columns + criteo_categorical_columns * c.dim + num_pairs;
    for (std::size_t h : c.hidden) {
      if (h == 0) throw dtf::error(dtf::errc::invalid_argument, "recommender::dlrm: a hidden layer of width 0");
      layers.emplace_back(in, h);  // each followed by a ReLU (fused: forward_relu, backward_relu)
      in = h;
    }
    layers.emplace_back(in, 1);
    return layers;
  }
  std::size_t width() const noexcept {
    return criteo_dense_columns + criteo_categorical_columns * c_.dim + num_pairs;
  }
  std::size_t wide_offset() const noexcept { return num_parameters_ - criteo_dense_columns; }
  void check_size(std::span<const float> b, const char* what) const {
    if (b.size() != num_parameters_)
      throw dtf::error(dtf::errc::shape_mismatch, std::string("recommender::dlrm: a ") + what + " buffer of " +
                                                      std::to_string(b.size()) + " floats, the model has " +
                                                      std::to_string(num_parameters_));
  }
  // The position of pair (i, j), i < j, in row-major order of the upper triangle.
  static std::size_t pair_index(std::size_t i, std::size_t j) noexcept {
    return i * criteo_categorical_columns - i * (i + 1) / 2 + (j - i - 1);
  }
  // The row (e, then b) of the id in `column` of `example`.
  const float* row(const dtf::embedding_rows& r, std::size_t example, std::size_t column) const noexcept {
    return r.values.data() + std::size_t(r.index[example * criteo_categorical_columns + column]) * (c_.dim + 1);
  }

  // z of the batch x (file comment) into input_ (built on the host, copied to the device), the
  // MLP's layers' outputs into acts_, and the logits into logit_ (host).
  void forward(std::span<const float> p, std::span<const dtf::embedding_rows> rows, const dtf::tensor& x) {
    check_size(p, "parameter");
    n_ = x.dim(0);
    if (rows.size() != 1 || rows[0].dim != c_.dim + 1 || rows[0].index.size() != n_ * criteo_categorical_columns)
      throw dtf::error(dtf::errc::shape_mismatch, "recommender::dlrm: rows of " + std::to_string(rows.size()) +
                                                      " tables for a batch of " + std::to_string(n_) +
                                                      " (1 table of dim " + std::to_string(c_.dim + 1) + " expected)");
    xh_.resize(x.size());
    x.copy_to_host<float>(std::span<float>(xh_));
    const std::size_t D = c_.dim, C = criteo_categorical_columns, W = width();
    zh_.resize(n_ * W);
    logit_.assign(n_, 0.0f);
    for (std::size_t e = 0; e < n_; ++e) {
      float* z = zh_.data() + e * W;
      std::copy_n(xh_.data() + e * feature_width, criteo_dense_columns, z);
      float* cat = z + criteo_dense_columns;
      for (std::size_t i = 0; i < C; ++i) {
        const float* ri = row(rows[0], e, i);
        std::copy_n(ri, D, cat + i * D);
        logit_[e] += ri[D];  // b_i
      }
      float* pair = cat + C * D;
      for (std::size_t i = 0; i < C; ++i)
        for (std::size_t j = i + 1; j < C; ++j) {
          float dot = 0;
          for (std::size_t k = 0; k < D; ++k) dot += cat[i * D + k] * cat[j * D + k];
          *pair++ = dot;
          logit_[e] += dot;  // the FM's second-order sum
        }
    }
    input_.resize({n_, W}, dtf::dtype::float32);
    input_.copy_from_host<float>(std::span<const float>(zh_));
    for (std::size_t i = 0; i < top_.size(); ++i) {
      const dtf::tensor& in = i == 0 ? input_ : acts_[i - 1];
      if (i + 1 < top_.size()) top_[i].forward_relu(p.data() + offsets_[i], in, acts_[i]);
      else top_[i].forward(p.data() + offsets_[i], in, acts_[i]);
    }
    deep_.resize(n_);
    acts_.back().copy_to_host<float>(std::span<float>(deep_));
    std::vector<float> w(criteo_dense_columns);
    thrust::copy(thrust::device_pointer_cast(p.data() + wide_offset()),
                 thrust::device_pointer_cast(p.data() + num_parameters_), w.begin());
    for (std::size_t e = 0; e < n_; ++e) {
      float t = deep_[e];
      for (std::size_t j = 0; j < criteo_dense_columns; ++j) t += w[j] * xh_[e * feature_width + j];
      logit_[e] += t;
    }
  }

  dlrm_config c_;
  std::vector<dtf::nn::dense> top_;
  std::vector<std::size_t> offsets_;  // each layer's first parameter
  std::vector<dtf::variable_spec> variables_;
  std::size_t num_parameters_ = 0, n_ = 0;
  std::vector<float> xh_, zh_, dz_, deep_, logit_;  // on the host: the batch, z, d loss / d z, the MLP's output, t
  std::vector<std::int32_t> labels_;
  dtf::tensor input_, input_grad_;
  std::vector<dtf::tensor> acts_, grads_;  // each layer's output and d loss / d output
};

static_assert(dtf::embedding_classifier<dlrm>, "recommender::dlrm must model dtf::embedding_classifier");

}  // namespace examples::recommender
