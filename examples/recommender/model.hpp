// examples/recommender/model.hpp — a DLRM-style click model (Naumov et al. 2019) over the
// Criteo columns, its embedding rows in a hashed table on the ps; models dtf::embedding_classifier.
//
// Input (a data::dataset's features, floats): per example the 13 numeric features
// (criteo_dense_value), then each of the 26 categorical ids as 4 floats of 16 bits each: a float
// holds an integer exactly only below 2^24, a 64-bit hash in 4 pieces (to_dataset()).
// The model, for an example with numeric features x and ids c_1..c_26:
//   e_i     the row of c_i in the hashed table "categorical" (dim D). One table for the 26
//           columns: criteo_id salts every id with its column, so two columns never share a row,
//           and a step gathers from each ps once instead of 26 times. A missing field (id 0)
//           has a row of its own, learnt like the others.
//   z       [x (13) | e_1..e_26 (26 D) | <e_i, e_j> for i < j (325)]: DLRM's dot interactions,
//           since a click log's signal is largely pairwise (this user's features with this
//           ad's), which an MLP over the concatenation alone learns slowly. DLRM's bottom MLP
//           over x is left out: x enters the top MLP directly.
//   logits  top MLP over z (ReLU layers, then 2 outputs): nn::sequential's two-class softmax
//           cross-entropy, which is logistic regression on z1 − z0: p(click) = sigmoid(z1 − z0)
//           and the loss is the binary cross-entropy of p (dtf/metrics/binary_eval.hpp reads it so).
// Dense variables: the top MLP's ("dense_<i>/kernel", "dense_<i>/bias"). Thread safety: one
// instance per thread (as nn::sequential).
#pragma once

#include <dtf/data/criteo.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/nn/sequential.hpp>

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
  std::uint32_t dim = 8;             ///< D: floats per row
  std::vector<std::size_t> hidden{64, 32};  ///< the top MLP's ReLU layers
  std::uint64_t max_rows = std::uint64_t(1) << 22;  ///< rows the hashed table holds at most
  std::uint64_t evict_after = 0;     ///< evict rows unseen for this many shard updates (0: never)
  float init_scale = 0.05f;          ///< rows start uniform in [-init_scale, init_scale]
};

class dlrm {
 public:
  explicit dlrm(const dlrm_config& c) : c_(c), top_(top_layers(c)) {}

  std::vector<dtf::variable_spec> variables() const { return top_.variables(); }
  std::vector<dtf::embedding_spec> embeddings() const {
    dtf::embedding_spec t;
    t.name = "categorical";
    t.rows = 0;  // hashed: any 64-bit id, a row made on first use
    t.dim = c_.dim;
    t.init.scale = c_.init_scale;
    t.max_rows = c_.max_rows;
    t.evict_after = c_.evict_after;
    return {t};
  }
  std::size_t num_parameters() const noexcept { return top_.num_parameters(); }
  void initialize(std::span<float> p, std::uint64_t seed) const { top_.initialize(p, seed); }

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

  float loss_and_gradients(std::span<const float> p, std::span<const dtf::embedding_rows> rows, const dtf::tensor& x,
                           const dtf::tensor& y, std::span<float> g) {
    forward_input(rows, x);
    const float loss = top_.loss_and_gradients(p, input_, y, g, &input_grad_);
    dz_.resize(input_grad_.size());
    input_grad_.copy_to_host<float>(std::span<float>(dz_));
    // d loss / d e_i = the concatenation's slot + Σ_{j≠i} d loss / d<e_i, e_j> · e_j; summed
    // over every use of a row (the model writes rows[0].grads whole).
    const auto& r = rows[0];
    std::fill(r.grads.begin(), r.grads.end(), 0.0f);
    const std::size_t D = c_.dim, C = criteo_categorical_columns, W = width();
    for (std::size_t e = 0; e < n_; ++e) {
      const float* dze = dz_.data() + e * W;
      const float* dpair = dze + criteo_dense_columns + C * D;
      for (std::size_t i = 0; i < C; ++i) {
        float* gi = r.grads.data() + std::size_t(r.index[e * C + i]) * D;
        const float* dcat = dze + criteo_dense_columns + i * D;
        for (std::size_t k = 0; k < D; ++k) gi[k] += dcat[k];
        for (std::size_t j = 0; j < C; ++j) {
          if (j == i) continue;
          const float d = dpair[pair_index(std::min(i, j), std::max(i, j))];
          const float* ej = row(r, e, j);
          for (std::size_t k = 0; k < D; ++k) gi[k] += d * ej[k];
        }
      }
    }
    return loss;
  }

  void logits(std::span<const float> p, std::span<const dtf::embedding_rows> rows, const dtf::tensor& x,
              dtf::tensor& out) {
    forward_input(rows, x);
    top_.logits(p, input_, out);
  }

 private:
  static dtf::nn::sequential top_layers(const dlrm_config& c) {
    if (c.dim == 0) throw dtf::error(dtf::errc::invalid_argument, "recommender::dlrm: dim must be positive");
    std::vector<dtf::nn::layer> layers;
    std::size_t in = criteo_dense_columns + criteo_categorical_columns * c.dim + num_pairs;
    for (std::size_t h : c.hidden) {
      if (h == 0) throw dtf::error(dtf::errc::invalid_argument, "recommender::dlrm: a hidden layer of width 0");
      layers.push_back(dtf::nn::dense(in, h));
      layers.push_back(dtf::nn::relu());
      in = h;
    }
    layers.push_back(dtf::nn::dense(in, 2));
    return dtf::nn::sequential(std::move(layers));
  }
  std::size_t width() const noexcept {
    return criteo_dense_columns + criteo_categorical_columns * c_.dim + num_pairs;
  }
  // The position of pair (i, j), i < j, in row-major order of the upper triangle.
  static std::size_t pair_index(std::size_t i, std::size_t j) noexcept {
    return i * criteo_categorical_columns - i * (i + 1) / 2 + (j - i - 1);
  }
  const float* row(const dtf::embedding_rows& r, std::size_t example, std::size_t column) const noexcept {
    return r.values.data() + std::size_t(r.index[example * criteo_categorical_columns + column]) * c_.dim;
  }

  // input_ = z of the batch x (file comment), built on the host and copied to the device.
  void forward_input(std::span<const dtf::embedding_rows> rows, const dtf::tensor& x) {
    n_ = x.dim(0);
    if (rows.size() != 1 || rows[0].dim != c_.dim || rows[0].index.size() != n_ * criteo_categorical_columns)
      throw dtf::error(dtf::errc::shape_mismatch, "recommender::dlrm: rows of " + std::to_string(rows.size()) +
                                                      " tables for a batch of " + std::to_string(n_) +
                                                      " (1 table of dim " + std::to_string(c_.dim) + " expected)");
    xh_.resize(x.size());
    x.copy_to_host<float>(std::span<float>(xh_));
    const std::size_t D = c_.dim, C = criteo_categorical_columns, W = width();
    zh_.resize(n_ * W);
    for (std::size_t e = 0; e < n_; ++e) {
      float* z = zh_.data() + e * W;
      std::copy_n(xh_.data() + e * feature_width, criteo_dense_columns, z);
      float* cat = z + criteo_dense_columns;
      for (std::size_t i = 0; i < C; ++i) std::copy_n(row(rows[0], e, i), D, cat + i * D);
      float* pair = cat + C * D;
      for (std::size_t i = 0; i < C; ++i)
        for (std::size_t j = i + 1; j < C; ++j) {
          float dot = 0;
          for (std::size_t k = 0; k < D; ++k) dot += cat[i * D + k] * cat[j * D + k];
          *pair++ = dot;
        }
    }
    input_.resize({n_, W}, dtf::dtype::float32);
    input_.copy_from_host<float>(std::span<const float>(zh_));
  }

  dlrm_config c_;
  dtf::nn::sequential top_;
  std::size_t n_ = 0;
  std::vector<float> xh_, zh_, dz_;  // the batch, z and d loss / d z on the host
  dtf::tensor input_, input_grad_;
};

static_assert(dtf::embedding_classifier<dlrm>, "recommender::dlrm must model dtf::embedding_classifier");

}  // namespace examples::recommender
