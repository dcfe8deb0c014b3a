// dtf/torch/module_model.hpp — a LibTorch torch::nn::Module as a dtf model: any network
// written with LibTorch's modules trains with every dtf strategy through dtf::train.
//
//   struct NetImpl : torch::nn::Cloneable<NetImpl> { ... };   TORCH_MODULE(Net);
//   dtf::libtorch::module_model<Net> net(Net(), {.input_shape = {1, 28, 28}});
//   dtf::train(cluster, net, data, dtf::strategies::downpour({}), options);
//
// Ownership and lifetime (the rule): the module owns its parameters, buffers and gradients, as
// any LibTorch module does, and never points into memory of dtf's. dtf's parameters live in the
// flat buffers the strategies own; a call that hands one (p) copies it into the module's own
// parameters first (initialize copies the other way), and loss_and_gradients lends each
// parameter's .grad() a view of its slice of the caller's gradient buffer g for that call only:
// the .grad() is undefined again when the call returns, thrown or not. So between calls, and
// after dtf::train returns (the strategy and its buffers gone), the module is a plain LibTorch
// module holding the values of the last p handed to it: torch::save, module->forward, a LibTorch
// optimizer and another dtf::train work on it. At its end dtf::train hands the job's trained
// values over (set_parameters): on every rank of a collective strategy, on the chief of a ps
// strategy; another ps worker keeps the parameters its last step's forward ran with. The hooks
// on the module's gradient accumulators go with the module_model. The module's structure
// (parameters, ties, frozen flags) is read when the module_model is constructed.
//
// The contract (models dtf::model, dtf::classifier and dtf::streams_gradients, dtf/concepts.hpp):
//   variables    the module's trainable parameters (requires_grad), in named_parameters() order,
//                under the names and shapes the module gives them, packed one after another in
//                dtf's flat buffer. A parameter reachable under several names (tied: one module
//                used twice) is one variable under its first name (dtf/torch/state.hpp). Every
//                parameter must be float32, dense and on the CPU; a module with none trainable
//                is refused (errc::invalid_argument naming the parameter or the module).
//   frozen       parameters with requires_grad(false) are not variables: initialize never
//                resets them, and they are buffers (below), the same on every rank.
//   parameters   copied from p into the module's own tensors at each loss_and_gradients and
//                logits (one memcpy per parameter: dtf's buffers may be freed or moved at any
//                time after the call).
//   gradients    no copies: during loss_and_gradients each parameter's .grad() is a view of its
//                slice of g; g is zeroed and autograd accumulates into it in place. A .grad()
//                that the forward or the loss replaced or cleared (zero_grad(set_to_none), a
//                backward with create_graph, whose AccumulateGrad adds out of place) is added
//                into its slice and lent again before dtf's backward, and checked once more
//                right before its slice is reported: what is reported is the whole gradient.
//   streaming    a post-hook on each parameter's gradient accumulator (as DDP's reducer)
//                calls ready(offset, size) when autograd has finalised that variable's
//                gradient, in the order autograd finishes them (LibTorch's CPU engine runs a
//                graph's nodes on the calling thread in sequence-number order); a variable with
//                no gradient this step (an unused branch) after backward, with zeros. Every float
//                exactly once. ring_allreduce cuts its buckets again in rank 0's first-step order,
//                as DDP (dtf/strategies/gradient_buckets.hpp): any declaration order overlaps.
//   input        x viewed (no copy) as [batch, input_shape...], labels widened to int64 for
//                loss(logits, labels) (cross-entropy by default): dtf/torch/options.hpp; or a
//                step of the user's, loss(module, batch), with named inputs (dtf/torch/step.hpp:
//                then no logits, no dtf::classifier). evaluation_loss: the loss's own value.
//   modes        dtf never sets a mode the user set: loss_and_gradients runs the module in the
//                modes it has (a module is constructed in train mode; a submodule the user put
//                in eval(), e.g. a BatchNorm with frozen statistics, stays in eval); logits
//                switches the root to eval, without autograd, and puts every submodule's mode
//                back after.
//   randomness   a module with a layer that draws random numbers in train mode (dropout, RReLU,
//                a dropout option of MultiheadAttention, LSTM, GRU, RNN; dtf/torch/seeding.hpp)
//                or options.random_forward: each forward in train mode reseeds LibTorch's
//                generator from (seed, task, replica, this copy's forward count) under a
//                process-wide lock held for the forward only: masks differ per task (options)
//                and replica (a copy's index among its source's copies) and are the same on a
//                rerun; the count is a buffer (below), so a resumed job draws no mask again.
//                Other modules' forwards run unlocked (mirrored replicas, Hogwild threads).
//   initialize   options.init: init_from::seed (the default) fills p from `seed`: every
//                built-in layer with parameters drawn as LibTorch's constructor draws it under
//                torch::manual_seed(seed) (its reset_parameters(): dtf/torch/seeding.hpp),
//                each layer once, frozen parameters kept; parameters a module of the user's
//                own registers keep their values. init_from::module (fine-tuning: after
//                torch::load) fills p with the module's current values, bit for bit.
//   copies       a copy is a deep copy (module->clone(): the module's Impl derives from
//                torch::nn::Cloneable<Impl>) with the source's ties, requires_grad flags and
//                modes (clone() itself loses the first two); mirrored makes one per replica.
//                A module that cannot clone is an error naming the cause when a copy is asked for.
//   threads      options.threads sets LibTorch's intra-op threads and dtf's BLAS threads
//                together (0, the default: leaves both as they are).
//   buffers      the module's float32 registered buffers (BatchNorm's running statistics), in
//                named_buffers() order, the frozen parameters, then (a module that draws
//                random numbers) its forward count "dtf/forward_count", are dtf::has_buffers: the
//                module's own tensors (each task's module updates its registered ones in train
//                mode), read and written by dtf::train, which keeps the chief's (rank 0's) as
//                the job's: saved with every checkpoint, restored (through resharding too),
//                broadcast to every rank at a collective job's start, published by a ps job's
//                chief for every worker to take at its start (dtf/train/buffers.hpp). Other
//                types (BatchNorm's int64 num_batches_tracked) stay each task's own.
//
// GPU: dtf/torch/device.hpp (compiled only, never run). Include only where LibTorch is needed (~15 s).
// Thread safety: one thread per instance (mirrored gives each replica its own copy).
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/error.hpp>
#include <dtf/runtime.hpp>
#include <dtf/tensor.hpp>
#include <dtf/torch/device.hpp>
#include <dtf/torch/options.hpp>
#include <dtf/torch/seeding.hpp>
#include <dtf/torch/state.hpp>
#include <dtf/torch/step.hpp>
#include <dtf/variable.hpp>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dtf::libtorch {

/// A torch::nn::Module (held by its ModuleHolder, e.g. torch::nn::Sequential or a
/// TORCH_MODULE type) as a dtf model. See the file comment for the contract.
template <class Module, class Loss = cross_entropy>
class module_model {
 public:
  /// Wraps `module` (the model holds it; a copy of the holder shares the module). Errors:
  /// errc::invalid_argument naming a parameter that is not float32, dense and on the CPU, or a
  /// module with no trainable parameters.
  explicit module_model(Module module, module_options options = {}, Loss loss = {})
      : module_(std::move(module)), options_(std::move(options)), loss_(std::move(loss)) {
    detail::check_inputs(options_, is_step);
    if (options_.threads > 0) {
      ::torch::set_num_threads(options_.threads);
      set_cpu_threads({.device = 0, .blas = options_.threads});
    }
    detail::to_dtf_device(*module_);  // CUDA builds: dtf's GPU (CPU: nothing)
    bind_module(nullptr);
  }

  /// A deep copy (module->clone()) with the source's ties, requires_grad flags and modes; its
  /// replica index is the number of copies made of `other` before it. Errors:
  /// errc::invalid_argument when the module cannot clone.
  module_model(const module_model& other)
      : module_(detail::clone_module(other.module_)), options_(other.options_), loss_(other.loss_),
        replica_(other.copies_->fetch_add(1)) {
    detail::copy_modes(*other.module_, *module_);
    bind_module(&other);
  }
  module_model& operator=(const module_model&) = delete;
  module_model(module_model&&) = delete;
  module_model& operator=(module_model&&) = delete;
  /// Takes its hooks off the module (which may live on).
  ~module_model() {
    for (auto& [node, key] : hooks_) node->del_post_hook(key);
  }

  /// The trainable parameters, each once, in named_parameters() order, packed.
  std::vector<variable_spec> variables() const { return variables_; }

  /// Floats in the flat buffer.
  std::size_t num_parameters() const noexcept { return num_parameters_; }

  /// The float32 registered buffers then the frozen parameters (dtf::has_buffers), packed in a
  /// flat space of their own.
  std::vector<variable_spec> buffers() const { return buffer_specs_; }

  /// Copies the buffers into out (num_parameters(buffers()) floats).
  void read_buffers(std::span<float> out) const {
    check_buffers(out.size());
    for (std::size_t i = 0; i < buffer_tensors_.size(); ++i)  // out: host memory
      detail::store_host(buffer_tensors_[i], out.data() + buffer_specs_[i].offset, buffer_specs_[i].size());
    if (random_) detail::put_count(forwards_, out.last(3));
  }

  /// Sets the buffers from in (num_parameters(buffers()) floats).
  void write_buffers(std::span<const float> in) {
    check_buffers(in.size());
    ::torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buffer_tensors_.size(); ++i)
      buffer_tensors_[i].copy_(detail::view(buffer_specs_, const_cast<float*>(in.data()), i, detail::host_memory()));
    if (random_) forwards_ = detail::get_count(in.last(3));
  }

  /// The module. It owns its parameters, which hold the last p handed to initialize,
  /// loss_and_gradients or logits (the file comment's lifetime rule).
  Module& module() noexcept { return module_; }

  /// Fills p as options.init says (see the file comment); the module then holds p's values.
  void initialize(std::span<float> p, std::uint64_t seed) {
    check_size(p.size(), "parameter");
    if (options_.init == init_from::seed) {
      ::torch::NoGradGuard no_grad;
      std::vector<::torch::Tensor> frozen;  // kept: the reset runs over whole layers
      for (const auto& s : params_.list)
        if (s.frozen) frozen.push_back(s.members.front().clone());
      std::vector<char> drawn(params_.list.size(), 0);  // each slot once: a tied layer is reached twice
      auto slot = [this](const ::torch::Tensor& t) {
        const auto it = slot_of_.find(t.unsafeGetTensorImpl());
        return it == slot_of_.end() ? std::size_t(-1) : it->second;
      };
      detail::reset_from_seed(
          *module_, seed, [&](const ::torch::Tensor& t) { return slot(t) != std::size_t(-1) && drawn[slot(t)]; },
          [&](const ::torch::Tensor& t) {
            if (slot(t) != std::size_t(-1)) drawn[slot(t)] = 1;
          });
      std::size_t k = 0;
      for (const auto& s : params_.list)
        if (s.frozen) s.members.front().copy_(frozen[k++]);
    }
    for (std::size_t i = 0; i < variables_.size(); ++i)
      detail::store(tensor_of(i), p.data() + variables_[i].offset, variables_[i].size());
    work_.wait();  // dtf reads p next
  }

  /// Mean loss of the batch; writes d loss / d p into g (dtf::model).
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g) {
    return step(p, x, y, g, nullptr);
  }

  /// The same, calling ready(first, count) for each variable as autograd finalises its
  /// gradient (dtf::streams_gradients; see the file comment).
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
                           const gradient_ready_fn& ready) {
    return step(p, x, y, g, ready ? &ready : nullptr);
  }

  /// Takes p's values into the module's own parameters (dtf::train hands the job's trained values
  /// over at its end: dtf::adopts_parameters). Errors: errc::shape_mismatch.
  void set_parameters(std::span<const float> p) {
    check_size(p.size(), "parameter");
    copy_in(p);
  }

  /// Logits [batch, classes] into out: the root in eval mode, without autograd; every
  /// submodule's mode put back after (dtf::classifier; not with a step of the module's own).
  void logits(std::span<const float> p, const tensor& x, tensor& out)
    requires(!module_step<Loss, Module>)
  {
    check_size(p.size(), "parameter");
    copy_in(p);
    ::torch::NoGradGuard no_grad;
    detail::mode_guard modes(*module_);
    module_->eval();
    detail::logits_into(module_->forward(input_of(x)), out);
  }

  /// The loss callable's mean value over the batch (dtf::evaluates_loss), evaluated as logits is;
  /// with a loss of logits and labels the logits go into out from the same forward, with a step
  /// of the module's own out is left empty.
  float evaluation_loss(std::span<const float> p, const tensor& x, const tensor& y, tensor& out) {
    check_size(p.size(), "parameter");
    copy_in(p);
    ::torch::NoGradGuard no_grad;
    detail::mode_guard modes(*module_);
    module_->eval();
    ::torch::Tensor z;
    const float loss = detail::loss_of(loss_, module_, x, y, options_, &z).template item<float>();
    if (z.defined()) detail::logits_into(z, out);
    else out.resize({0}, dtype::float32);
    return loss;
  }

 private:
  // Reads the module's parameters and buffers into slots (as `source`'s for a copy), checks
  // them, and hooks the trainable ones' gradient accumulators.
  void bind_module(const module_model* source) {
    std::vector<std::pair<std::string, ::torch::Tensor>> named;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      detail::check_parameter(item.key(), item.value());
      named.emplace_back(item.key(), item.value());
    }
    params_ = detail::group_slots(named, source ? &source->params_ : nullptr, /*parameters=*/true);
    named.clear();
    for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
      const auto& t = item.value();
      if (t.scalar_type() == ::torch::kFloat && t.layout() == ::torch::kStrided && t.device() == detail::dtf_device())
        named.emplace_back(item.key(), t);
    }
    buffers_ = detail::group_slots(named, source ? &source->buffers_ : nullptr, /*parameters=*/false);
    random_ = options_.random_forward;
    for (const auto& m : module_->modules(/*include_self=*/true)) {
      random_ = random_ || detail::draws_random(*m);
      detail::check_dense_gradients(*m);
    }
    std::size_t offset = 0, buffer_offset = 0;
    auto add_buffer = [&](const detail::tensor_slot& s) {
      buffer_specs_.push_back({s.name, detail::shape_of(s.members.front()), buffer_offset});
      buffer_offset += std::size_t(s.members.front().numel());
      buffer_tensors_.push_back(s.members.front());
    };
    for (const auto& s : buffers_.list) add_buffer(s);
    for (std::size_t k = 0; k < params_.list.size(); ++k) {
      const auto& s = params_.list[k];
      for (const auto& m : s.members) slot_of_[m.unsafeGetTensorImpl()] = k;
      if (s.frozen) {
        add_buffer(s);
        continue;
      }
      variables_.push_back({s.name, detail::shape_of(s.members.front()), offset});
      offset += std::size_t(s.members.front().numel());
      trainable_.push_back(k);
    }
    if (random_) buffer_specs_.push_back({detail::forward_count_name, {3}, buffer_offset});  // after a resume, no mask replays
    if (variables_.empty())
      throw error(errc::invalid_argument,
                  "dtf::libtorch::module_model: the module '" + module_->name() + "' has no trainable parameters");
    num_parameters_ = offset;
    fired_.assign(variables_.size(), 0);
    for (std::size_t i = 0; i < variables_.size(); ++i)
      for (const auto& m : members(i)) {
        // Held: the accumulator (and its hook) lives across steps, as DDP's reducer holds it.
        auto acc = ::torch::autograd::impl::grad_accumulator(m);
        const auto key = acc->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
            [this, i](const ::torch::autograd::variable_list& outputs, const ::torch::autograd::variable_list&) {
              on_gradient(i);
              return outputs;
            }));
        hooks_.emplace_back(std::move(acc), key);
      }
  }

  const std::vector<::torch::Tensor>& members(std::size_t i) const { return params_.list[trainable_[i]].members; }
  const ::torch::Tensor& tensor_of(std::size_t i) const { return members(i).front(); }

  void check_buffers(std::size_t n) const {
    detail::check_floats(n, dtf::num_parameters(buffer_specs_), "buffers span", "the module's buffers have");
  }
  void check_size(std::size_t n, const char* what) const {
    detail::check_floats(n, num_parameters_, std::string(what) + " buffer", "the module has");
  }

  // p's values into the module's own parameters (a tie's tensors share one storage; GPU: after dtf's work).
  void copy_in(std::span<const float> p) {
    detail::wait_for_dtf();
    ::torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < variables_.size(); ++i) {
      const ::torch::Tensor& t = tensor_of(i);
      if (!detail::on_gpu && t.is_contiguous())
        std::memcpy(t.data_ptr<float>(), p.data() + variables_[i].offset, variables_[i].size_bytes());
      else
        t.copy_(view(const_cast<float*>(p.data()), i));
    }
  }

  ::torch::Tensor view(float* base, std::size_t i) const { return detail::view(variables_, base, i); }

  // x [batch, features] viewed as [batch, input_shape...].
  ::torch::Tensor input_of(const tensor& x) const { return detail::input_of(x, options_.input_shape); }

  void on_gradient(std::size_t i) {
    if (!ready_ || ++fired_[i] != members(i).size()) return;  // a tie in a copy: final after its last tensor
    absorb(i);  // the slice holds the whole gradient before it is reported
    work_.wait();  // GPU: and LibTorch's stream has written it (this runs on its device thread)
    (*ready_)(variables_[i].offset, variables_[i].size());
  }

  // Variable i's tensors whose .grad() is not the view of its slice of the lent gradient (g_):
  // replaced or cleared by user code or autograd (zero_grad(set_to_none), a backward with
  // create_graph, which accumulates out of place) since it was lent. A replaced one's values are
  // added into the slice (it holds what the others accumulated; a replacement holds this one's),
  // and every one gets the view again, so that autograd accumulates into the slice from then on.
  void absorb(std::size_t i) {
    float* slice = g_ + variables_[i].offset;
    ::torch::NoGradGuard no_grad;
    for (const auto& t : members(i)) {
      const auto& grad = t.grad();
      if (grad.defined() && grad.data_ptr() == static_cast<void*>(slice)) continue;
      const auto lent = view(g_, i);
      if (grad.defined()) lent.add_(grad.detach());
      t.mutable_grad() = lent;
    }
  }

  float step(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
             const gradient_ready_fn* ready) {
    check_size(p.size(), "parameter");
    check_size(g.size(), "gradient");
    copy_in(p);
    // The loan of g ends with the call: the .grad() views and the ready callback go, thrown or not.
    struct end_of_loan {
      module_model& m;
      ~end_of_loan() {
        m.ready_ = nullptr;
        m.g_ = nullptr;
        for (std::size_t i = 0; i < m.variables_.size(); ++i)
          for (const auto& t : m.members(i)) t.mutable_grad() = ::torch::Tensor();
      }
    } loan{*this};
    g_ = g.data();
    for (std::size_t i = 0; i < variables_.size(); ++i) {
      const auto slice = view(g.data(), i);
      for (const auto& t : members(i)) t.mutable_grad() = slice;
    }
    detail::zero(g.data(), g.size());  // autograd accumulates into the views (GPU: on its stream)
    ::torch::Tensor loss;
    {
      std::unique_lock<std::mutex> lock;
      if (random_) {
        lock = std::unique_lock(detail::generator_mutex());
        ::torch::manual_seed(detail::mix(detail::mix(detail::mix(options_.seed) ^ options_.task) ^ replica_) ^
                             forwards_);
      }
      ++forwards_;
      loss = detail::loss_of(loss_, module_, x, y, options_);
    }
    // The forward or the loss may have replaced or cleared .grad()s (zero_grad(set_to_none), a
    // backward of its own): taken in and lent again before backward, whose reports must find
    // every gradient in g.
    for (std::size_t i = 0; i < variables_.size(); ++i) absorb(i);
    std::fill(fired_.begin(), fired_.end(), 0);
    ready_ = ready;
    loss.backward();
    ready_ = nullptr;
    for (std::size_t i = 0; i < variables_.size(); ++i) {
      if (ready && fired_[i] == members(i).size()) continue;  // reported, its gradient absorbed first
      absorb(i);
      if (!ready) continue;
      work_.wait();
      (*ready)(variables_[i].offset, variables_[i].size());  // unused this step: zeros
    }
    work_.wait();  // dtf reads g next
    return loss.template item<float>();
  }

  static constexpr bool is_step = module_step<Loss, Module>;
  Module module_;
  module_options options_;
  Loss loss_;
  std::uint64_t replica_ = 0;
  std::uint64_t forwards_ = 0;
  bool random_ = false;
  std::shared_ptr<std::atomic<std::uint64_t>> copies_ = std::make_shared<std::atomic<std::uint64_t>>(0);
  detail::tensor_slots params_, buffers_;
  std::unordered_map<const void*, std::size_t> slot_of_;  // each parameter tensor's slot
  std::vector<std::size_t> trainable_;                    // variable i is params_.list[trainable_[i]]
  std::vector<variable_spec> variables_, buffer_specs_;
  std::vector<::torch::Tensor> buffer_tensors_;
  std::vector<std::pair<std::shared_ptr<::torch::autograd::Node>, std::uintptr_t>> hooks_;
  std::vector<std::size_t> fired_;
  const gradient_ready_fn* ready_ = nullptr;
  float* g_ = nullptr;  // the gradient buffer lent during loss_and_gradients
  detail::torch_work work_;  // GPU: LibTorch's stream waited for before dtf reads
  std::size_t num_parameters_ = 0;
};

static_assert(classifier<module_model<::torch::nn::Sequential>>, "module_model must model dtf::classifier");
static_assert(streams_gradients<module_model<::torch::nn::Sequential>>,
              "module_model must model dtf::streams_gradients");
static_assert(has_buffers<module_model<::torch::nn::Sequential>>, "module_model must model dtf::has_buffers");
static_assert(evaluates_loss<module_model<::torch::nn::Sequential>>, "module_model must model dtf::evaluates_loss");

}  // namespace dtf::libtorch
