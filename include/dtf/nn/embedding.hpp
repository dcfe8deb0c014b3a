// dtf/nn/embedding.hpp — embedding lookups over the rows a batch gathered (host memory).
//
// The rows come from dtf::embedding_tables::gather (one row per distinct id, lookup::unique)
// and the batch refers to them through lookup::index. A bag is a run of ids combined into one
// vector (tf.nn.embedding_lookup_sparse's combiners):
//   sum    out[b] = sum of the bag's rows
//   mean   out[b] = that sum / the bag's length (an empty bag gives zeros)
// Bags of one id each (offsets 0, 1, 2, ...) are plain lookups: for a batch of B examples of L
// ids each, out is [B * L, dim] = [B, L * dim] row-major, the concatenation of the L vectors.
//
// backward() gives the gradient of the rows, deduplicated: a row used several times in the batch
// gets the sum of its uses' gradients (what TensorFlow's sparse apply sums from IndexedSlices
// with repeated indices), in lookup::unique's order, ready for embedding_tables::push.
#pragma once

#include <dtf/error.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dtf::nn {

/// How an embedding_bag combines the rows of a bag: their sum, or their mean (an empty bag gives
/// zeros).
enum class combiner { sum, mean };

/// Embedding lookups over the rows a batch gathered (host memory): each bag, a run of ids, is
/// combined into one vector; backward() gives the rows' gradients, deduplicated (summed over a
/// row's uses), in lookup::unique's order.
class embedding_bag {
 public:
  /// Bags of `dim`-float rows combined by `c`. Errors: errc::invalid_argument when dim is 0.
  explicit embedding_bag(std::uint32_t dim, combiner c = combiner::mean) : dim_(dim), combiner_(c) {
    if (dim == 0) throw error(errc::invalid_argument, "nn::embedding_bag: dim must be positive");
  }
  /// Floats per row.
  std::uint32_t dim() const noexcept { return dim_; }

  /// out[b] (dim floats) combines rows[index[i]] for i in [offsets[b], offsets[b + 1]).
  /// rows: (distinct rows) * dim; out: (offsets.size() - 1) * dim.
  void forward(std::span<const float> rows, std::span<const std::uint32_t> index,
               std::span<const std::size_t> offsets, std::span<float> out) const {
    check(rows.size(), index, offsets, out.size(), "forward");
    std::fill(out.begin(), out.end(), 0.0f);
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
      float* o = out.data() + b * dim_;
      for (std::size_t i = offsets[b]; i < offsets[b + 1]; ++i) {
        const float* r = rows.data() + std::size_t(index[i]) * dim_;
        for (std::uint32_t k = 0; k < dim_; ++k) o[k] += r[k];
      }
      const std::size_t n = offsets[b + 1] - offsets[b];
      if (combiner_ == combiner::mean && n > 1)
        for (std::uint32_t k = 0; k < dim_; ++k) o[k] /= float(n);
    }
  }

  /// row_grads[u] = sum over the uses i of row u of d_out[bag of i] (times 1 / bag length for
  /// mean). row_grads: (distinct rows) * dim, overwritten.
  void backward(std::span<const float> d_out, std::span<const std::uint32_t> index,
                std::span<const std::size_t> offsets, std::span<float> row_grads) const {
    check(row_grads.size(), index, offsets, d_out.size(), "backward");
    std::fill(row_grads.begin(), row_grads.end(), 0.0f);
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
      const float* d = d_out.data() + b * dim_;
      const std::size_t n = offsets[b + 1] - offsets[b];
      const float w = combiner_ == combiner::mean && n > 1 ? 1.0f / float(n) : 1.0f;
      for (std::size_t i = offsets[b]; i < offsets[b + 1]; ++i) {
        float* g = row_grads.data() + std::size_t(index[i]) * dim_;
        for (std::uint32_t k = 0; k < dim_; ++k) g[k] += w * d[k];
      }
    }
  }

  /// Offsets of bags of one id each (plain lookups): 0, 1, ..., n.
  static std::vector<std::size_t> singletons(std::size_t n) {
    std::vector<std::size_t> o(n + 1);
    for (std::size_t i = 0; i <= n; ++i) o[i] = i;
    return o;
  }

 private:
  void check(std::size_t rows_floats, std::span<const std::uint32_t> index, std::span<const std::size_t> offsets,
             std::size_t out_floats, const char* what) const {
    const std::size_t rows = rows_floats / dim_;
    if (rows_floats % dim_ != 0 || offsets.empty() || offsets.front() != 0 || offsets.back() != index.size() ||
        out_floats != (offsets.size() - 1) * dim_)
      throw error(errc::shape_mismatch, std::string("nn::embedding_bag::") + what + ": " +
                                            std::to_string(offsets.size() - 1) + " bags over " +
                                            std::to_string(index.size()) + " ids, " + std::to_string(out_floats) +
                                            " output floats, dim " + std::to_string(dim_));
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
      if (offsets[b + 1] < offsets[b])
        throw error(errc::invalid_argument, std::string("nn::embedding_bag::") + what + ": offsets decrease at bag " +
                                                std::to_string(b));
    for (auto i : index)
      if (i >= rows)
        throw error(errc::out_of_range, std::string("nn::embedding_bag::") + what + ": row " + std::to_string(i) +
                                            " of " + std::to_string(rows) + " gathered");
  }

  std::uint32_t dim_;
  combiner combiner_;
};

}  // namespace dtf::nn
