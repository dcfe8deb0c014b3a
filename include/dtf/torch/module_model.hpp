// dtf/torch/module_model.hpp — a LibTorch torch::nn::Module as a dtf model: any network
// written with LibTorch's modules trains with every dtf strategy through dtf::train.
//
//   struct NetImpl : torch::nn::Cloneable<NetImpl> { ... };   TORCH_MODULE(Net);
//   dtf::torch::module_model<Net> net(Net(), {.input_shape = {1, 28, 28}, .threads = 1});
//   dtf::train(cluster, net, data, dtf::strategies::downpour({}), options);
//
// The contract (models dtf::model, dtf::classifier and dtf::streams_gradients, dtf/concepts.hpp):
//   variables    the module's named_parameters(), in its declaration order, under the names and
//                shapes the module gives them, packed one after another in dtf's flat buffer.
//                Every parameter must be float32, dense and on the CPU; a module with none is
//                refused (errc::invalid_argument naming the parameter or the module).
//   parameters   no copies: the module's parameters are tensors built over the buffer the
//                strategy hands loss_and_gradients (torch::from_blob + set_data), rebound only
//                when the strategy hands a different buffer (a pointer comparison per call).
//   gradients    no copies: each parameter's .grad() is a tensor over its slice of the caller's
//                gradient buffer; the buffer is zeroed and autograd accumulates into it in
//                place. Should anything replace a .grad() (it never does with LibTorch 1.13's
//                AccumulateGrad outside create_graph), its values are copied in and the slice
//                rebound: at most one copy.
//   streaming    a post-hook on each parameter's gradient accumulator (as DDP's reducer)
//                calls ready(offset, size) when autograd has finalised that parameter's
//                gradient, in the order autograd finishes them (the same on every rank for the
//                same graph: LibTorch's CPU engine runs a graph's nodes on the calling thread in
//                sequence-number order). A parameter that received no gradient this step (an
//                unused branch) is reported after backward with zeros. Every float exactly once.
//   input        x [batch, features] float32 is viewed (no copy) as [batch, input_shape...];
//                a feature count that is not the product of input_shape is
//                errc::shape_mismatch naming both. Labels (int32) are widened to int64 for
//                the loss, a callable loss(logits, labels) -> scalar tensor (cross-entropy by
//                default).
//   modes        loss_and_gradients runs the module in train mode; logits in eval mode with
//                no autograd.
//   randomness   each forward in train mode reseeds LibTorch's generator from (seed, task,
//                replica, this copy's forward count) under a process-wide lock held for the
//                forward only: dropout masks differ per task and per replica and are the same
//                on a rerun. `task` comes from the options (the example passes its index
//                among the training tasks); a copy's replica index is the number of copies made
//                of its source before it (mirrored copies the model once per replica, in order).
//   initialize   p from `seed`: under torch::manual_seed(seed) the reset_parameters() of
//                LibTorch's built-in layers (Linear, Conv1-3d, BatchNorm1-3d, LayerNorm,
//                Embedding); parameters of other modules keep their constructed values.
//   copies       a copy is a deep copy (module->clone(): the module's Impl derives from
//                torch::nn::Cloneable<Impl>); mirrored makes one per replica. A module that
//                cannot clone is an error naming the cause when a copy is asked for.
//   threads      options.threads sets LibTorch's intra-op threads and dtf's BLAS threads
//                together (0: leaves both).
//   buffers      the module's float32 registered buffers (BatchNorm's running statistics), in
//                named_buffers() order, are dtf::has_buffers: the module's own tensors (each
//                task's module updates its own in train mode), read and written by dtf::train,
//                which keeps the chief's (rank 0's) as the job's: saved with every checkpoint,
//                restored (through resharding too), broadcast to every rank at a collective
//                job's start. Buffers of other types (BatchNorm's int64 num_batches_tracked,
//                which only momentum-less BatchNorm reads) stay each task's own.
//
// CPU builds only: Debian's LibTorch is built without CUDA, and dtf's device memory on CUDA
// builds is GPU memory. Include this header only in translation units that need LibTorch; it
// costs about 15 s of compile time and dtf/dtf.hpp never includes it. Link dtf::torch.
// Thread safety: one thread per instance (mirrored gives each replica its own copy).
#pragma once

#if DTF_CUDA
#error "dtf/torch: the LibTorch adapter is for CPU builds (Debian's LibTorch has no CUDA)"
#endif

#include <dtf/concepts.hpp>
#include <dtf/error.hpp>
#include <dtf/runtime.hpp>
#include <dtf/tensor.hpp>
#include <dtf/torch/seeding.hpp>
#include <dtf/variable.hpp>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::torch {

/// The default loss: mean softmax cross-entropy of logits [batch, classes] against int64 labels.
struct cross_entropy {
  /// The mean loss of the batch (a scalar tensor autograd can differentiate).
  ::torch::Tensor operator()(const ::torch::Tensor& logits, const ::torch::Tensor& labels) const {
    return ::torch::nn::functional::cross_entropy(logits, labels);
  }
};

/// How module_model feeds and runs the module.
struct module_options {
  /// One example's shape as the module takes it, e.g. {1, 28, 28} for a convolutional network on
  /// Fashion-MNIST; empty: [batch, features] as the data has it.
  std::vector<std::int64_t> input_shape;
  /// LibTorch's intra-op threads and dtf's BLAS threads (one option for both); 0 leaves both.
  int threads = 1;
  /// Base seed of the dropout masks (combined with task, replica and forward count).
  std::uint64_t seed = 0;
  /// This task's index among the training tasks (its dropout masks differ from the others').
  std::uint64_t task = 0;
};

/// A torch::nn::Module (held by its ModuleHolder, e.g. torch::nn::Sequential or a
/// TORCH_MODULE type) as a dtf model. See the file comment for the contract.
template <class Module, class Loss = cross_entropy>
class module_model {
 public:
  /// Wraps `module` (the model holds it; a copy of the holder shares the module). Errors:
  /// errc::invalid_argument naming a parameter that is not float32, dense and on the CPU, or a
  /// module with no parameters.
  explicit module_model(Module module, module_options options = {}, Loss loss = {})
      : module_(std::move(module)), options_(std::move(options)), loss_(std::move(loss)) {
    if (options_.threads > 0) {
      ::torch::set_num_threads(options_.threads);
      set_cpu_threads({.device = 0, .blas = options_.threads});
    }
    bind_module();
  }

  /// A deep copy (module->clone()); its replica index is the number of copies made of `other`
  /// before it. Errors: errc::invalid_argument when the module cannot clone.
  module_model(const module_model& other)
      : module_(clone_of(other.module_)), options_(other.options_), loss_(other.loss_),
        replica_(other.copies_->fetch_add(1)) {
    bind_module();
  }
  module_model& operator=(const module_model&) = delete;
  module_model(module_model&&) = delete;
  module_model& operator=(module_model&&) = delete;

  /// The parameters, as named_parameters() gives them (declaration order), packed.
  std::vector<variable_spec> variables() const { return variables_; }

  /// Floats in the flat buffer.
  std::size_t num_parameters() const noexcept { return num_parameters_; }

  /// The float32 buffers (dtf::has_buffers), in named_buffers() order, packed in a flat space
  /// of their own.
  std::vector<variable_spec> buffers() const { return buffer_specs_; }

  /// Copies the buffers into out (num_parameters(buffers()) floats).
  void read_buffers(std::span<float> out) const {
    check_buffers(out.size());
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      const ::torch::Tensor values = buffers_[i].contiguous();
      std::memcpy(out.data() + buffer_specs_[i].offset, values.data_ptr<float>(), buffer_specs_[i].size_bytes());
    }
  }

  /// Sets the buffers from in (num_parameters(buffers()) floats).
  void write_buffers(std::span<const float> in) {
    check_buffers(in.size());
    ::torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(view(buffer_specs_, const_cast<float*>(in.data()), i));
  }

  /// The module (its parameters view the last buffer handed to loss_and_gradients or logits).
  Module& module() noexcept { return module_; }

  /// Fills p from `seed`: the built-in layers' own initialisation under torch::manual_seed(seed)
  /// (see the file comment), then the module's values copied into p.
  void initialize(std::span<float> p, std::uint64_t seed) {
    check_size(p.size(), "parameter");
    {
      std::lock_guard lock(detail::generator_mutex());
      ::torch::NoGradGuard no_grad;
      ::torch::manual_seed(seed);
      for (const auto& m : module_->modules(/*include_self=*/true)) detail::reset_builtin(*m);
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto values = params_[i].detach().contiguous();
      std::memcpy(p.data() + variables_[i].offset, values.data_ptr<float>(), variables_[i].size_bytes());
    }
  }

  /// Mean loss of the batch; writes d loss / d p into g (dtf::model).
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g) {
    return step(p, x, y, g, nullptr);
  }

  /// The same, calling ready(first, count) for each parameter as autograd finalises its
  /// gradient (dtf::streams_gradients; see the file comment).
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
                           const gradient_ready_fn& ready) {
    return step(p, x, y, g, ready ? &ready : nullptr);
  }

  /// Logits [batch, classes] into out, in eval mode without autograd (dtf::classifier).
  void logits(std::span<const float> p, const tensor& x, tensor& out) {
    check_size(p.size(), "parameter");
    bind_parameters(p.data());
    ::torch::NoGradGuard no_grad;
    module_->eval();
    const ::torch::Tensor z = module_->forward(input_of(x)).contiguous();
    module_->train();
    if (z.dim() != 2)
      throw error(errc::shape_mismatch, "dtf::torch::module_model: the module's output has " + std::to_string(z.dim()) +
                                            " dimensions; logits are [batch, classes]");
    out.resize({std::size_t(z.size(0)), std::size_t(z.size(1))}, dtype::float32);
    std::memcpy(out.template data<float>(), z.data_ptr<float>(), out.size_bytes());
  }

 private:
  static Module clone_of(const Module& m) {
    std::shared_ptr<::torch::nn::Module> copy;
    try {
      copy = m->clone();
    } catch (const c10::Error& e) {
      throw error(errc::invalid_argument, std::string("dtf::torch::module_model: a copy of the model (mirrored makes one "
                                                      "per replica) needs module->clone(): ") +
                                              e.what_without_backtrace());
    }
    auto typed = std::dynamic_pointer_cast<typename Module::ContainedType>(copy);
    if (!typed) throw error(errc::internal, "dtf::torch::module_model: clone() returned another module type");
    return Module(std::move(typed));
  }

  // Reads the module's parameters and buffers into variables_, checks them, and hooks their
  // gradient accumulators.
  void bind_module() {
    module_->train();
    std::size_t offset = 0;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      const auto& t = item.value();
      const std::string& name = item.key();
      if (t.scalar_type() != ::torch::kFloat)
        throw error(errc::invalid_argument, "dtf::torch::module_model: parameter '" + name + "' is " +
                                                std::string(c10::toString(t.scalar_type())) +
                                                "; dtf trains float32 parameters only");
      if (t.layout() != ::torch::kStrided)
        throw error(errc::invalid_argument, "dtf::torch::module_model: parameter '" + name + "' is not dense");
      if (!t.device().is_cpu())
        throw error(errc::invalid_argument, "dtf::torch::module_model: parameter '" + name + "' is not on the CPU");
      if (!t.requires_grad()) continue;  // frozen: not a variable dtf trains
      dims shape;
      for (auto d : t.sizes()) shape.push_back(std::size_t(d));
      variables_.push_back({name, shape, offset});
      offset += std::size_t(t.numel());
      params_.push_back(t);
    }
    for (const auto& m : module_->modules(/*include_self=*/true)) {
      if (auto* e = dynamic_cast<::torch::nn::EmbeddingImpl*>(m.get()); e && e->options.sparse())
        throw error(errc::invalid_argument, "dtf::torch::module_model: an Embedding with sparse gradients (parameter "
                                            "'weight' of " + e->name() + "); dtf takes dense float32 gradients");
      if (auto* e = dynamic_cast<::torch::nn::EmbeddingBagImpl*>(m.get()); e && e->options.sparse())
        throw error(errc::invalid_argument, "dtf::torch::module_model: an EmbeddingBag with sparse gradients; dtf takes "
                                            "dense float32 gradients");
    }
    std::size_t buffer_offset = 0;
    for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
      const auto& t = item.value();
      if (t.scalar_type() != ::torch::kFloat || t.layout() != ::torch::kStrided || !t.device().is_cpu()) continue;
      dims shape;
      for (auto d : t.sizes()) shape.push_back(std::size_t(d));
      buffer_specs_.push_back({item.key(), shape, buffer_offset});
      buffer_offset += std::size_t(t.numel());
      buffers_.push_back(t);
    }
    if (params_.empty())
      throw error(errc::invalid_argument,
                  "dtf::torch::module_model: the module '" + module_->name() + "' has no trainable parameters");
    num_parameters_ = offset;
    reported_.assign(params_.size(), false);
    accumulators_.clear();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      // The accumulator exists once the parameter requires grad; holding it keeps it (and its
      // hook) alive across steps, as DDP's reducer does.
      auto acc = ::torch::autograd::impl::grad_accumulator(params_[i]);
      acc->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
          [this, i](const ::torch::autograd::variable_list& outputs, const ::torch::autograd::variable_list&) {
            on_gradient(i);
            return outputs;
          }));
      accumulators_.push_back(std::move(acc));
    }
  }

  void check_buffers(std::size_t n) const {
    if (n != dtf::num_parameters(buffer_specs_))
      throw error(errc::shape_mismatch, "dtf::torch::module_model: buffers span has " + std::to_string(n) +
                                            " floats, the module's buffers have " +
                                            std::to_string(dtf::num_parameters(buffer_specs_)));
  }

  void check_size(std::size_t n, const char* what) const {
    if (n != num_parameters_)
      throw error(errc::shape_mismatch, std::string("dtf::torch::module_model: ") + what + " buffer has " +
                                            std::to_string(n) + " floats, the module has " +
                                            std::to_string(num_parameters_));
  }

  // The module's parameters become views of p (when p is not the buffer they already view).
  void bind_parameters(const float* p) {
    if (p == bound_params_) return;
    ::torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].set_data(view(const_cast<float*>(p), i));
    bound_params_ = p;
  }

  // Each parameter's .grad() becomes a view of its slice of g.
  void bind_gradients(float* g) {
    if (g == bound_grads_) return;
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = view(g, i);
    bound_grads_ = g;
  }

  ::torch::Tensor view(float* base, std::size_t i) const { return view(variables_, base, i); }

  // specs[i] of the flat buffer at base, as a tensor over it.
  static ::torch::Tensor view(const std::vector<variable_spec>& specs, float* base, std::size_t i) {
    std::vector<std::int64_t> sizes;
    for (auto d : specs[i].shape) sizes.push_back(std::int64_t(d));
    return ::torch::from_blob(base + specs[i].offset, sizes, ::torch::TensorOptions().dtype(::torch::kFloat));
  }

  // x [batch, features] viewed as [batch, input_shape...].
  ::torch::Tensor input_of(const tensor& x) const {
    if (x.type() != dtype::float32 || x.rank() < 1)
      throw error(errc::invalid_argument, "dtf::torch::module_model: features must be float32 [batch, ...]");
    const std::int64_t batch = std::int64_t(x.dim(0));
    std::vector<std::int64_t> sizes{batch};
    if (options_.input_shape.empty()) {
      for (std::size_t d = 1; d < x.rank(); ++d) sizes.push_back(std::int64_t(x.dim(d)));
    } else {
      std::int64_t per_example = 1;
      for (auto d : options_.input_shape) per_example *= d;
      const std::size_t features = batch == 0 ? 0 : x.size() / std::size_t(batch);
      if (per_example <= 0 || std::size_t(per_example) != features) {
        std::string shape;
        for (auto d : options_.input_shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        throw error(errc::shape_mismatch, "dtf::torch::module_model: an example has " + std::to_string(features) +
                                              " features, the input shape [" + shape + "] takes " +
                                              std::to_string(per_example));
      }
      sizes.insert(sizes.end(), options_.input_shape.begin(), options_.input_shape.end());
    }
    return ::torch::from_blob(const_cast<float*>(x.template data<float>()), sizes,
                              ::torch::TensorOptions().dtype(::torch::kFloat));
  }

  ::torch::Tensor labels_of(const tensor& y, std::int64_t batch) const {
    if (y.type() != dtype::int32 || y.rank() != 1 || std::int64_t(y.dim(0)) != batch)
      throw error(errc::shape_mismatch, "dtf::torch::module_model: labels must be int32 [batch] with batch " +
                                            std::to_string(batch));
    return ::torch::from_blob(const_cast<std::int32_t*>(y.template data<std::int32_t>()), {batch},
                              ::torch::TensorOptions().dtype(::torch::kInt))
        .to(::torch::kLong);
  }

  void on_gradient(std::size_t i) {
    if (!ready_ || reported_[i]) return;
    reported_[i] = true;
    (*ready_)(variables_[i].offset, variables_[i].size());
  }

  float step(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
             const gradient_ready_fn* ready) {
    check_size(p.size(), "parameter");
    check_size(g.size(), "gradient");
    bind_parameters(p.data());
    bind_gradients(g.data());
    std::fill(g.begin(), g.end(), 0.0f);  // autograd accumulates into the views
    const auto input = input_of(x);
    const auto labels = labels_of(y, input.size(0));
    module_->train();
    ::torch::Tensor loss;
    {
      std::lock_guard lock(detail::generator_mutex());
      ::torch::manual_seed(detail::mix(detail::mix(detail::mix(options_.seed) ^ options_.task) ^ replica_) ^
                           forwards_++);
      loss = loss_(module_->forward(input), labels);
    }
    std::fill(reported_.begin(), reported_.end(), false);
    ready_ = ready;
    struct clear_ready {
      const gradient_ready_fn*& r;
      ~clear_ready() { r = nullptr; }
    } clear{ready_};
    loss.backward();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& grad = params_[i].grad();
      float* slice = g.data() + variables_[i].offset;
      if (grad.defined() && grad.data_ptr() != static_cast<void*>(slice)) {  // replaced: copy it in, rebind
        const auto values = grad.contiguous();
        std::memcpy(slice, values.data_ptr<float>(), variables_[i].size_bytes());
        params_[i].mutable_grad() = view(g.data(), i);
      }
      if (ready && !reported_[i]) {  // no gradient this step (an unused branch): zeros
        reported_[i] = true;
        (*ready)(variables_[i].offset, variables_[i].size());
      }
    }
    return loss.item<float>();
  }

  Module module_;
  module_options options_;
  Loss loss_;
  std::uint64_t replica_ = 0;
  std::uint64_t forwards_ = 0;
  std::shared_ptr<std::atomic<std::uint64_t>> copies_ = std::make_shared<std::atomic<std::uint64_t>>(0);
  std::vector<variable_spec> variables_, buffer_specs_;
  std::vector<::torch::Tensor> params_, buffers_;
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators_;
  std::vector<bool> reported_;
  const gradient_ready_fn* ready_ = nullptr;
  std::size_t num_parameters_ = 0;
  const float* bound_params_ = nullptr;
  float* bound_grads_ = nullptr;
};

static_assert(classifier<module_model<::torch::nn::Sequential>>, "module_model must model dtf::classifier");
static_assert(streams_gradients<module_model<::torch::nn::Sequential>>,
              "module_model must model dtf::streams_gradients");
static_assert(has_buffers<module_model<::torch::nn::Sequential>>, "module_model must model dtf::has_buffers");

}  // namespace dtf::torch
