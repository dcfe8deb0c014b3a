// dtf/torch/state.hpp — how the LibTorch adapter (dtf/torch/module_model.hpp) reads a module's
// state as LibTorch leaves it, and keeps it faithful in copies:
//   slots   LibTorch's C++ named_parameters() and named_buffers() list a tensor once per name
//           it is reachable under (a Linear used twice in a Sequential: twice); Python's
//           deduplicate. A slot is one state: the tensors that are it, under its first name. A
//           module's slots are grouped by tensor identity. A copy (clone()) makes each reach of
//           a tied tensor a tensor of its own and turns requires_grad back on (it re-runs
//           reset()): its slots are grouped as its source's are, by name, its tied tensors made
//           to share one storage and its requires_grad flags set as the source's.
//   modes   the train/eval flag of every submodule, recorded and put back, so that evaluation
//           (which switches the root to eval) leaves each submodule in the mode its user set.
//   copies  clone() wrapped: an error naming the cause when the module cannot clone.
#pragma once

#include <dtf/error.hpp>
#include <dtf/torch/device.hpp>
#include <dtf/variable.hpp>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dtf::libtorch::detail {

/// One state of a module: a parameter or buffer, reachable under one or more names.
struct tensor_slot {
  std::string name;                      // the first name the module gives it
  std::vector<::torch::Tensor> members;  // the tensors that are it (several only in a copy)
  bool frozen = false;                   // a parameter with requires_grad(false)
};

/// A module's slots, in the order of their first names, and every name's slot.
struct tensor_slots {
  std::vector<tensor_slot> list;
  std::unordered_map<std::string, std::size_t> index;
};

/// Groups `named` (every name a tensor is reachable under, as LibTorch lists them) into slots:
/// by tensor identity when `source` is null, else as the source's (a copy of it: same names).
/// A copy's tensors of one slot come to share the first one's storage, and each parameter's
/// requires_grad is set as the source's (`parameters`).
/// Errors: errc::invalid_argument when a copy has a name its source does not, or lacks one.
inline tensor_slots group_slots(const std::vector<std::pair<std::string, ::torch::Tensor>>& named,
                                const tensor_slots* source, bool parameters) {
  tensor_slots out;
  if (!source) {
    std::unordered_map<const void*, std::size_t> by_tensor;
    for (const auto& [name, t] : named) {
      const auto [it, fresh] = by_tensor.try_emplace(t.unsafeGetTensorImpl(), out.list.size());
      if (fresh) out.list.push_back({name, {t}, parameters && !t.requires_grad()});
      out.index.emplace(name, it->second);
    }
    return out;
  }
  ::torch::NoGradGuard no_grad;
  for (const auto& s : source->list) out.list.push_back({s.name, {}, s.frozen});
  for (const auto& [name, t] : named) {
    const auto it = source->index.find(name);
    if (it == source->index.end())
      throw error(errc::invalid_argument, "dtf::libtorch::module_model: the copy of the module (clone()) has '" + name +
                                              "', which the module has not");
    auto& slot = out.list[it->second];
    out.index.emplace(name, it->second);
    bool known = false;
    for (const auto& m : slot.members) known = known || m.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
    if (known) continue;
    auto member = t;
    if (!slot.members.empty()) member.set_data(slot.members.front().detach());  // the tie, as in the source
    if (parameters) member.requires_grad_(!slot.frozen);
    slot.members.push_back(std::move(member));
  }
  for (const auto& s : out.list)
    if (s.members.empty())
      throw error(errc::invalid_argument, "dtf::libtorch::module_model: the copy of the module (clone()) has no '" + s.name +
                                              "', which the module has");
  return out;
}

/// Errors: errc::invalid_argument naming a parameter that is not float32, dense and on dtf's
/// device (the CPU; CUDA builds: the current GPU, where the constructor moved the module).
inline void check_parameter(const std::string& name, const ::torch::Tensor& t) {
  if (t.scalar_type() != ::torch::kFloat)
    throw error(errc::invalid_argument, "dtf::libtorch::module_model: parameter '" + name + "' is " +
                                            std::string(c10::toString(t.scalar_type())) +
                                            "; dtf trains float32 parameters only");
  if (t.layout() != ::torch::kStrided)
    throw error(errc::invalid_argument, "dtf::libtorch::module_model: parameter '" + name + "' is not dense");
  if (t.device() != dtf_device())
    throw error(errc::invalid_argument,
                "dtf::libtorch::module_model: parameter '" + name + "' is not on " + dtf_device_name());
}

/// Errors: errc::invalid_argument for an Embedding or EmbeddingBag with sparse gradients.
inline void check_dense_gradients(::torch::nn::Module& m) {
  if (auto* e = dynamic_cast<::torch::nn::EmbeddingImpl*>(&m); e && e->options.sparse())
    throw error(errc::invalid_argument, "dtf::libtorch::module_model: an Embedding with sparse gradients (parameter "
                                        "'weight' of " + e->name() + "); dtf takes dense float32 gradients");
  if (auto* e = dynamic_cast<::torch::nn::EmbeddingBagImpl*>(&m); e && e->options.sparse())
    throw error(errc::invalid_argument, "dtf::libtorch::module_model: an EmbeddingBag with sparse gradients; dtf takes "
                                        "dense float32 gradients");
}

/// Every submodule's train/eval flag, root first (pre-order).
inline std::vector<std::pair<std::shared_ptr<::torch::nn::Module>, bool>> modes_of(const ::torch::nn::Module& root) {
  std::vector<std::pair<std::shared_ptr<::torch::nn::Module>, bool>> out;
  for (const auto& m : root.modules(/*include_self=*/true)) out.emplace_back(m, m->is_training());
  return out;
}

/// Puts the flags back: train(on) recurses, so setting them root first, each submodule after
/// its parents, leaves every one as recorded.
inline void restore_modes(const std::vector<std::pair<std::shared_ptr<::torch::nn::Module>, bool>>& modes) {
  for (const auto& [m, on] : modes) m->train(on);
}

/// Every submodule's flag, put back when the guard goes (thrown or not): evaluation switches the
/// root to eval for its forward only.
struct mode_guard {
  explicit mode_guard(const ::torch::nn::Module& root) : modes(modes_of(root)) {}
  mode_guard(const mode_guard&) = delete;
  mode_guard& operator=(const mode_guard&) = delete;
  ~mode_guard() { restore_modes(modes); }
  std::vector<std::pair<std::shared_ptr<::torch::nn::Module>, bool>> modes;
};

/// A copy's modes set as its source's, submodule by submodule (by name).
inline void copy_modes(const ::torch::nn::Module& source, ::torch::nn::Module& copy) {
  const auto theirs = source.named_modules("", /*include_self=*/true);
  for (const auto& item : copy.named_modules("", /*include_self=*/true))
    if (const auto* m = theirs.find(item.key())) item.value()->train((*m)->is_training());
}

/// A deep copy of the module a holder holds (module->clone()). Errors: errc::invalid_argument
/// when it cannot clone (its Impl does not derive from torch::nn::Cloneable<Impl>).
template <class Holder>
Holder clone_module(const Holder& m) {
  std::shared_ptr<::torch::nn::Module> copy;
  try {
    copy = m->clone();
  } catch (const c10::Error& e) {
    throw error(errc::invalid_argument, std::string("dtf::libtorch::module_model: a copy of the model (mirrored makes one "
                                                    "per replica) needs module->clone(): ") +
                                            e.what_without_backtrace());
  }
  auto typed = std::dynamic_pointer_cast<typename Holder::ContainedType>(copy);
  if (!typed) throw error(errc::internal, "dtf::libtorch::module_model: clone() returned another module type");
  return Holder(std::move(typed));
}

/// specs[i] of the flat buffer at base, as a tensor over it (no copy): dtf's memory (parameters,
/// gradients) by default, `where` host_memory() for the host spans of buffers.
inline ::torch::Tensor view(const std::vector<variable_spec>& specs, float* base, std::size_t i,
                            const ::torch::TensorOptions& where = dtf_memory()) {
  std::vector<std::int64_t> sizes;
  for (auto d : specs[i].shape) sizes.push_back(std::int64_t(d));
  return ::torch::from_blob(base + specs[i].offset, sizes, where);
}

/// Errors: errc::shape_mismatch when a span has n floats where `expected` belong.
inline void check_floats(std::size_t n, std::size_t expected, const std::string& what, const char* theirs) {
  if (n != expected)
    throw error(errc::shape_mismatch, "dtf::libtorch::module_model: " + what + " has " + std::to_string(n) + " floats, " +
                                          theirs + " " + std::to_string(expected));
}

/// A tensor's shape as dtf's dims.
inline dims shape_of(const ::torch::Tensor& t) {
  dims shape;
  for (auto d : t.sizes()) shape.push_back(std::size_t(d));
  return shape;
}

}  // namespace dtf::libtorch::detail
