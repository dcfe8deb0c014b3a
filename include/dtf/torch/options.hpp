// dtf/torch/options.hpp — how the LibTorch adapter (dtf/torch/module_model.hpp) feeds and runs
// a module: its options, its default loss, and dtf's features and labels as the tensors the
// module and the loss take.
//
// Namespace: dtf::libtorch (it was dtf::torch, which shadowed ::torch in code that says
// `using namespace dtf;`, making `torch::Tensor` ambiguous). dtf::torch stays an alias of it for
// this release; define DTF_NO_LEGACY_TORCH_NAMESPACE before including dtf/torch/ headers (or
// on the compile line) to drop it, so that `using namespace dtf;` leaves `torch::` to LibTorch.
#pragma once

#include <dtf/error.hpp>
#include <dtf/tensor.hpp>
#include <dtf/torch/device.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtf::libtorch {

/// The default loss: mean softmax cross-entropy of logits [batch, classes] against int64 labels.
struct cross_entropy {
  /// The mean loss of the batch (a scalar tensor autograd can differentiate).
  ::torch::Tensor operator()(const ::torch::Tensor& logits, const ::torch::Tensor& labels) const {
    return ::torch::nn::functional::cross_entropy(logits, labels);
  }
};

/// Where initialize takes the parameters from.
enum class init_from {
  seed,    ///< LibTorch's built-in layers re-initialised from the seed (frozen parameters kept)
  module,  ///< the module's current values (fine-tuning a loaded model), bit for bit
};

/// Columns of the features that a step of the module's own (dtf/torch/step.hpp) takes as one
/// named input: the next `width` columns after the previous input's.
struct named_input {
  std::string name;        ///< the input's name, as the step asks for it (batch["name"])
  std::int64_t width = 0;  ///< its columns (at least 1)
};

/// How module_model feeds and runs the module.
struct module_options {
  /// One example's shape as the module takes it, e.g. {1, 28, 28} for a convolutional network on
  /// Fashion-MNIST; empty: [batch, features] as the data has it.
  std::vector<std::int64_t> input_shape;
  /// LibTorch's intra-op threads and dtf's BLAS threads (one option for both); 0 leaves both.
  int threads = 0;
  /// Base seed of the dropout masks (combined with task, replica and forward count).
  std::uint64_t seed = 0;
  /// This task's index among the training tasks (its dropout masks differ from the others').
  std::uint64_t task = 0;
  /// Where initialize takes the parameters from (see init_from).
  init_from init = init_from::seed;
  /// The forward draws random numbers in code of the module's own (torch::dropout in a custom
  /// forward), which dtf cannot see: reseed and lock for every forward as for dropout layers.
  bool random_forward = false;
  /// A step of the module's own (a loss callable loss(module, batch), dtf/torch/step.hpp): the
  /// features' columns split into named inputs, in order, e.g. {{"dense", 13}, {"ids", 26}};
  /// the widths add up to the features' count. Empty: the step takes the whole rows.
  std::vector<named_input> inputs;
};

namespace detail {

/// x [batch, features] float32 viewed (no copy) as [batch, input_shape...] (empty: as x is).
/// Errors: errc::invalid_argument for other features; errc::shape_mismatch naming both when the
/// feature count is not the product of input_shape.
inline ::torch::Tensor input_of(const tensor& x, const std::vector<std::int64_t>& input_shape) {
  if (x.type() != dtype::float32 || x.rank() < 1)
    throw error(errc::invalid_argument, "dtf::libtorch::module_model: features must be float32 [batch, ...]");
  const std::int64_t batch = std::int64_t(x.dim(0));
  std::vector<std::int64_t> sizes{batch};
  if (input_shape.empty()) {
    for (std::size_t d = 1; d < x.rank(); ++d) sizes.push_back(std::int64_t(x.dim(d)));
  } else {
    std::int64_t per_example = 1;
    for (auto d : input_shape) per_example *= d;
    const std::size_t features = batch == 0 ? 0 : x.size() / std::size_t(batch);
    if (per_example <= 0 || std::size_t(per_example) != features) {
      std::string shape;
      for (auto d : input_shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      throw error(errc::shape_mismatch, "dtf::libtorch::module_model: an example has " + std::to_string(features) +
                                            " features, the input shape [" + shape + "] takes " +
                                            std::to_string(per_example));
    }
    sizes.insert(sizes.end(), input_shape.begin(), input_shape.end());
  }
  return ::torch::from_blob(const_cast<float*>(x.template data<float>()), sizes, dtf_memory());
}

/// Labels int32 [batch] widened to int64 for the loss. Errors: errc::shape_mismatch otherwise.
inline ::torch::Tensor labels_of(const tensor& y, std::int64_t batch) {
  if (y.type() != dtype::int32 || y.rank() != 1 || std::int64_t(y.dim(0)) != batch)
    throw error(errc::shape_mismatch, "dtf::libtorch::module_model: labels must be int32 [batch] with batch " +
                                          std::to_string(batch));
  return ::torch::from_blob(const_cast<std::int32_t*>(y.template data<std::int32_t>()), {batch},
                            dtf_memory(::torch::kInt))
      .to(::torch::kLong);
}

}  // namespace detail

}  // namespace dtf::libtorch

#ifndef DTF_NO_LEGACY_TORCH_NAMESPACE
namespace dtf {
/// The adapter's former namespace name, kept for one release (see the file comment).
namespace torch = libtorch;
}  // namespace dtf
#endif
