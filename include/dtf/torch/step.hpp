// dtf/torch/step.hpp — the general step of the LibTorch adapter (dtf/torch/module_model.hpp): a
// module with several inputs, float targets or an output other than logits trains through a
// loss callable of the user's, loss(module, batch) -> scalar tensor, in place of the default
// loss(module->forward(features), labels).
//
//   auto step = [](Net& m, const dtf::libtorch::batch& b) {
//     return torch::mse_loss(m->forward(b["dense"], b["ids"]).squeeze(1), b["target"].squeeze(1));
//   };
//   dtf::libtorch::module_model net(Net(), {.inputs = {{"dense", 13}, {"ids", 26}, {"target", 1}}}, step);
//
// Which form a loss callable is: one invocable as loss(Module&, const batch&) returning a tensor
// is a step (module_step); any other is loss(logits, int64 labels). A step's model trains and
// evaluates (its loss, evaluation_loss) as the other form's, but has no logits: it is no
// dtf::classifier (its forward may take anything), so evaluation reports its loss, not accuracy.
//
// The batch is dtf's [batch, features] float32 features and int32 labels as LibTorch tensors
// over dtf's memory (no copy of the features): dtf's datasets carry int32 labels, so float
// targets are columns of the features, named among options.inputs like any input.
#pragma once

#include <dtf/error.hpp>
#include <dtf/tensor.hpp>
#include <dtf/torch/options.hpp>

#include <torch/torch.h>

#include <concepts>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace dtf::libtorch {

/// One batch as a step of the module's own takes it (views over dtf's memory, valid during the
/// call that hands it).
struct batch {
  /// The whole rows, [batch, input_shape...] (options.input_shape; empty: [batch, features]).
  ::torch::Tensor features;
  /// dtf's int32 labels widened to int64, [batch].
  ::torch::Tensor labels;
  /// options.inputs, in order: each its columns of the rows, [batch, width], a strided view
  /// (call .contiguous() before an op that needs contiguous memory, e.g. view()).
  std::vector<std::pair<std::string, ::torch::Tensor>> inputs;

  /// The input named `name`. Errors: errc::invalid_argument naming it and the inputs there are.
  const ::torch::Tensor& operator[](std::string_view name) const {
    std::string known;
    for (const auto& [n, t] : inputs) {
      if (n == name) return t;
      known += (known.empty() ? "" : ", ") + n;
    }
    throw error(errc::invalid_argument, "dtf::libtorch::batch: no input '" + std::string(name) + "' (options.inputs: " +
                                            (known.empty() ? std::string("none") : known) + ")");
  }
};

/// A loss callable that is a step of the module's own: loss(module, batch) -> tensor.
template <class Loss, class Module>
concept module_step = std::invocable<Loss&, Module&, const batch&> &&
                      std::convertible_to<std::invoke_result_t<Loss&, Module&, const batch&>, ::torch::Tensor>;

namespace detail {

/// options.inputs checked once, when the model is built. Errors: errc::invalid_config for an
/// empty or repeated name, a width below 1, or inputs given to a loss of logits and labels.
inline void check_inputs(const module_options& o, bool step) {
  auto bad = [](const std::string& why) { throw error(errc::invalid_config, "dtf::libtorch::module_options.inputs: " + why); };
  if (!step && !o.inputs.empty())
    bad("named inputs are for a step of the module's own, loss(module, batch) (dtf/torch/step.hpp)");
  for (std::size_t i = 0; i < o.inputs.size(); ++i) {
    const auto& in = o.inputs[i];
    if (in.name.empty()) bad("input " + std::to_string(i) + " has no name");
    if (in.width < 1) bad("'" + in.name + "' has width " + std::to_string(in.width) + " (must be at least 1)");
    for (std::size_t j = 0; j < i; ++j)
      if (o.inputs[j].name == in.name) bad("'" + in.name + "' is named twice");
  }
}

/// x and y as a step takes them. Errors: those of input_of and labels_of, and
/// errc::shape_mismatch when options.inputs' widths do not add up to the features' count.
inline batch batch_of(const tensor& x, const tensor& y, const module_options& o) {
  batch b;
  b.features = input_of(x, o.input_shape);
  const std::int64_t rows = b.features.size(0);
  b.labels = labels_of(y, rows);
  if (o.inputs.empty()) return b;
  const std::int64_t columns = rows == 0 ? 0 : std::int64_t(x.size()) / rows;
  std::int64_t total = 0;
  for (const auto& in : o.inputs) total += in.width;
  if (rows > 0 && total != columns)
    throw error(errc::shape_mismatch, "dtf::libtorch::module_model: options.inputs take " + std::to_string(total) +
                                          " columns, the features have " + std::to_string(columns));
  float* base = const_cast<float*>(x.template data<float>());
  std::int64_t at = 0;
  for (const auto& in : o.inputs) {
    b.inputs.emplace_back(in.name, ::torch::from_blob(base + at, {rows, in.width}, {columns, 1}, dtf_memory()));
    at += in.width;
  }
  return b;
}

/// The module's output as dtf's logits [batch, classes] in out (a copy; on a GPU complete when
/// this returns). Errors: errc::shape_mismatch when it is not two-dimensional.
inline void logits_into(const ::torch::Tensor& logits, tensor& out) {
  const ::torch::Tensor z = logits.contiguous();
  if (z.dim() != 2)
    throw error(errc::shape_mismatch, "dtf::libtorch::module_model: the module's output has " + std::to_string(z.dim()) +
                                          " dimensions; logits are [batch, classes]");
  out.resize({std::size_t(z.size(0)), std::size_t(z.size(1))}, dtype::float32);
  store(z, out.template data<float>(), out.size());
  torch_work().wait();  // dtf reads out next (an event per call: logits runs once per evaluation batch)
}

/// The batch's loss as the model computes it: a step's loss(module, batch), or
/// loss(module->forward(features), labels), whose logits go to *logits when asked for.
/// Errors: errc::invalid_argument when a step returns no scalar.
template <class Loss, class Module>
::torch::Tensor loss_of(Loss& loss, Module& module, const tensor& x, const tensor& y, const module_options& o,
                        ::torch::Tensor* logits = nullptr) {
  if constexpr (module_step<Loss, Module>) {
    ::torch::Tensor l = std::invoke(loss, module, batch_of(x, y, o));
    if (!l.defined() || l.numel() != 1)
      throw error(errc::invalid_argument, "dtf::libtorch::module_model: the step loss(module, batch) returned " +
                                              (l.defined() ? std::to_string(l.numel()) + " values" : std::string("none")) +
                                              "; it must return the batch's mean loss, a scalar");
    return l;
  } else {
    const ::torch::Tensor input = input_of(x, o.input_shape);
    ::torch::Tensor z = module->forward(input);
    if (logits) *logits = z;
    return loss(z, labels_of(y, input.size(0)));
  }
}

}  // namespace detail

}  // namespace dtf::libtorch
