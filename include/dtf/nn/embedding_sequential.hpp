// dtf/nn/embedding_sequential.hpp — an embedding lookup under a stack of dense layers: ids in,
// classes out. Models dtf::embedding_classifier (dtf/embedding_model.hpp).
//
//   dtf::nn::embedding_sequential net(
//       {.table = {.name = "words", .rows = 10000, .dim = 32}, .ids_per_example = 3},
//       dtf::nn::sequential{dtf::nn::dense(3 * 32, 128), dtf::nn::relu(), dtf::nn::dense(128, 10000)});
//
// The features of a batch are ids_per_example columns of ids, stored as floats (exact below
// 2^24; an id that is negative, fractional or larger is an error naming its row and column).
// Combining the looked-up rows (combine):
//   concat  the rows in column order, [batch, ids_per_example * dim] (a word's context: positions matter)
//   sum     one bag per example, [batch, dim] (tf.nn.embedding_lookup_sparse's "sum")
//   mean    the same divided by ids_per_example ("mean")
// The table is the model's only sparse variable; the dense layers are its variables
// ("dense_<i>/kernel", "dense_<i>/bias" as in nn::sequential).
// Thread safety: as nn::sequential (one instance per thread).
#pragma once

#include <dtf/embedding_model.hpp>
#include <dtf/nn/embedding.hpp>
#include <dtf/nn/sequential.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace dtf::nn {

/// How embedding_sequential combines an example's looked-up rows: `concat` (in column order,
/// [batch, ids_per_example * dim]), `sum` or `mean` (one bag per example, [batch, dim]).
enum class embedding_combine { concat, sum, mean };

/// The embedding lookup at the bottom of an embedding_sequential.
struct embedding_input {
  embedding_spec table;             ///< the table ids are looked up in (fixed or hashed)
  std::size_t ids_per_example = 1;  ///< feature columns, each an id
  /// How an example's rows are combined.
  embedding_combine combine = embedding_combine::concat;
};

/// An embedding lookup under a stack of dense layers: ids in, classes out; models
/// dtf::embedding_classifier. A batch's features are ids_per_example columns of ids stored as
/// floats. One instance per thread.
class embedding_sequential {
 public:
  /// Errors: errc::shape_mismatch when the dense stack's input width is not what the lookup
  /// produces (ids_per_example * dim for concat, dim otherwise); invalid_argument for no ids.
  embedding_sequential(embedding_input in, sequential dense)
      : in_(std::move(in)),
        dense_(std::move(dense)),
        bag_(in_.table.dim, in_.combine == embedding_combine::sum ? combiner::sum : combiner::mean) {
    if (in_.ids_per_example == 0)
      throw error(errc::invalid_argument, "nn::embedding_sequential: ids_per_example must be positive");
    if (dense_.input_features() != width())
      throw error(errc::shape_mismatch, "nn::embedding_sequential: the dense layers take " +
                                            std::to_string(dense_.input_features()) + " inputs, the lookup of " +
                                            std::to_string(in_.ids_per_example) + " ids of dim " +
                                            std::to_string(in_.table.dim) + " gives " + std::to_string(width()));
  }

  /// dtf::embedding_model: the dense variables.
  std::vector<variable_spec> variables() const { return dense_.variables(); }
  /// dtf::embedding_model: the table.
  std::vector<embedding_spec> embeddings() const { return {in_.table}; }
  /// The number of dense parameters.
  std::size_t num_parameters() const noexcept { return dense_.num_parameters(); }
  /// The number of classes (the last layer's width).
  std::size_t num_classes() const noexcept { return dense_.num_classes(); }
  /// dtf::embedding_model: fills the dense parameters `p` deterministically from `seed`.
  void initialize(std::span<float> p, std::uint64_t seed) const { dense_.initialize(p, seed); }

  /// The ids of batch b (table 0): its feature columns, row by row.
  void embedding_ids(const data::host_batch& b, std::size_t table, std::vector<std::uint64_t>& ids) const {
    if (table != 0)
      throw error(errc::out_of_range, "nn::embedding_sequential: table " + std::to_string(table) + " of 1");
    const std::size_t n = b.features.shape(0), cols = b.features.shape(1);
    if (cols != in_.ids_per_example)
      throw error(errc::shape_mismatch, "nn::embedding_sequential: a batch of " + std::to_string(cols) +
                                            " feature columns, the model looks up " +
                                            std::to_string(in_.ids_per_example) + " ids per example");
    ids.resize(n * cols);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        const float v = b.features(r, c);
        if (!(v >= 0.0f) || v >= 16777216.0f || std::floor(v) != v)
          throw error(errc::invalid_argument, "nn::embedding_sequential: feature (" + std::to_string(r) + ", " +
                                                  std::to_string(c) + ") = " + std::to_string(v) +
                                                  " is not an id (an integer in [0, 2^24))");
        ids[r * cols + c] = std::uint64_t(v);
      }
  }

  /// dtf::embedding_model: the batch's mean loss; writes the dense gradient into `g` and the
  /// rows' gradients into rows[0].grads.
  float loss_and_gradients(std::span<const float> p, std::span<const embedding_rows> rows, const tensor& x,
                           const tensor& y, std::span<float> g) {
    return loss_and_gradients(p, rows, x, y, g, gradient_ready_fn{});
  }

  /// dtf::streams_row_gradients: the same, calling ready with each Dense layer's variables as
  /// soon as their gradient is written, from the last layer to the first (a hybrid job reduces
  /// them on the ring while the layers below and the rows' gradients are computed).
  float loss_and_gradients(std::span<const float> p, std::span<const embedding_rows> rows, const tensor& x,
                           const tensor& y, std::span<float> g, const gradient_ready_fn& ready) {
    lookup(rows, x.dim(0));
    const float loss = dense_.loss_and_gradients(p, input_, y, g, &input_grad_, ready);
    if constexpr (device_memory_is_host_accessible) {
      bag_.backward(std::as_const(input_grad_).span<float>(), rows[0].index, offsets_, rows[0].grads);
    } else {
      host_.resize(input_grad_.size());
      input_grad_.copy_to_host<float>(std::span<float>(host_));
      bag_.backward(host_, rows[0].index, offsets_, rows[0].grads);
    }
    return loss;
  }

  /// dtf::embedding_classifier: the logits of batch `x` into `out`.
  void logits(std::span<const float> p, std::span<const embedding_rows> rows, const tensor& x, tensor& out) {
    lookup(rows, x.dim(0));
    dense_.logits(p, input_, out);
  }

 private:
  std::size_t width() const noexcept {
    return in_.combine == embedding_combine::concat ? in_.ids_per_example * in_.table.dim : in_.table.dim;
  }
  // input_ = the combined rows of a batch of n examples; offsets_ the bags.
  void lookup(std::span<const embedding_rows> rows, std::size_t n) {
    if (rows.size() != 1 || rows[0].dim != in_.table.dim)
      throw error(errc::shape_mismatch, "nn::embedding_sequential: " + std::to_string(rows.size()) +
                                            " tables of rows, the model has 1 of dim " + std::to_string(in_.table.dim));
    // Bags: one id each (concat) or ids_per_example each; rebuilt in place, no allocation per step.
    const std::size_t per_bag = in_.combine == embedding_combine::concat ? 1 : in_.ids_per_example;
    const std::size_t bags = n * in_.ids_per_example / per_bag;
    offsets_.resize(bags + 1);
    for (std::size_t i = 0; i <= bags; ++i) offsets_[i] = i * per_bag;
    input_.resize({n, width()}, dtype::float32);
    if constexpr (device_memory_is_host_accessible) {  // straight into the dense layers' input
      bag_.forward(rows[0].values, rows[0].index, offsets_, input_.span<float>());
    } else {
      host_.resize(n * width());
      bag_.forward(rows[0].values, rows[0].index, offsets_, host_);
      input_.copy_from_host<float>(std::span<const float>(host_));
    }
  }

  embedding_input in_;
  sequential dense_;
  embedding_bag bag_;
  std::vector<std::size_t> offsets_;
  std::vector<float> host_;  // CUDA builds: the lookup's output, then d loss / d output, on the host
  tensor input_, input_grad_;
};

static_assert(embedding_classifier<embedding_sequential>, "nn::embedding_sequential must model dtf::embedding_classifier");

}  // namespace dtf::nn
