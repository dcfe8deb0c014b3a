// dtf/concepts.hpp — the contracts between dtf and user code that are checked at compile time.
//
// Each concept lists its required expressions; every built-in type that models one is
// static_assert-ed right after its definition.
#pragma once

#include <dtf/optim/rules.hpp>
#include <dtf/tensor.hpp>
#include <dtf/variable.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace dtf {

/// model: something dtf can train.
///
/// Parameters and gradients are flat float32 buffers in device memory owned by the caller
/// (a strategy, a parameter server, a test); each variable is a slice of them.
///
/// Required expressions, for `const M cm`, `M m`, spans `p` (params) and `g` (grads) of
/// num_parameters(cm.variables()) floats, device tensors `x` (features, [batch, ...],
/// float32) and `y` (labels, [batch], int32), and a seed `s`:
///   cm.variables()                     -> std::vector<variable_spec>  names, shapes, offsets
///   m.initialize(p, s)                 fills p deterministically from s
///   m.loss_and_gradients(cp, x, y, g)  -> float: mean loss over the batch; writes (does not
///                                      accumulate) d loss / d p into g
/// loss_and_gradients may keep workspace in m, so one instance serves one thread at a time.
template <class M>
concept model = requires(const M& cm, M& m, std::span<float> p, std::span<const float> cp, std::span<float> g,
                         const tensor& x, const tensor& y, std::uint64_t s) {
  { cm.variables() } -> std::convertible_to<std::vector<variable_spec>>;
  m.initialize(p, s);
  { m.loss_and_gradients(cp, x, y, g) } -> std::convertible_to<float>;
};

/// What a model's backprop calls as gradients become final: floats [first, first + count) of the
/// gradient buffer g hold their final values (on CUDA builds: the kernels that wrote them have
/// completed), and the model writes them no more in this call.
using gradient_ready_fn = std::function<void(std::size_t first, std::size_t count)>;

/// streams_gradients: a model that hands each variable's gradient to the strategy as soon as
/// backprop has produced it, so that its communication overlaps the rest of backprop
/// (optional: a model without it is reduced after backprop). For `ready` a gradient_ready_fn:
///   m.loss_and_gradients(cp, x, y, g, ready) -> float  as above, and calls ready for every
///                                       float of g exactly once, in the order backprop
///                                       finishes them (the same order on every task),
///                                       typically once per variable from the top layer down
template <class M>
concept streams_gradients = model<M> && requires(M& m, std::span<const float> cp, const tensor& x, const tensor& y,
                                                 std::span<float> g, const gradient_ready_fn& ready) {
  { m.loss_and_gradients(cp, x, y, g, ready) } -> std::convertible_to<float>;
};

/// defers_loss: a model whose step can leave its loss on the device (optional), so that the
/// step reads nothing back and dtf::train reads the losses at the hooks' cadence through a
/// device::loss_ring (docs/design/gpu-execution.md, section 5). For `ready` as above:
///   m.enqueue_loss_and_gradients(cp, x, y, g, ready)  as loss_and_gradients, returning nothing:
///                                       the mean loss is left at m.device_loss()
///   m.device_loss() -> const float*    the last step's mean loss (device memory; host memory
///                                       on CPU builds), written by the work the step issued
template <class M>
concept defers_loss = streams_gradients<M> && requires(M& m, const M& cm, std::span<const float> cp, const tensor& x,
                                                       const tensor& y, std::span<float> g,
                                                       const gradient_ready_fn& ready) {
  m.enqueue_loss_and_gradients(cp, x, y, g, ready);
  { cm.device_loss() } -> std::convertible_to<const float*>;
};

/// classifier: a model that also produces logits, so accuracy can be measured.
///   m.logits(cp, x, out)  writes [batch, classes] float32 logits into the device tensor out
///                         (resizing it)
template <class M>
concept classifier = model<M> && requires(M& m, std::span<const float> cp, const tensor& x, tensor& out) {
  m.logits(cp, x, out);
};

/// evaluates_loss: a model whose own loss is the one evaluation reports (optional; a LibTorch
/// module's loss callable: label smoothing, MSE, a step of its own). nn::evaluate (and so
/// dtf::evaluate_on) reports it instead of softmax cross-entropy of the logits, and a model with
/// it needs no logits (its accuracy is then 0). For a device tensor `out`:
///   m.evaluation_loss(cp, x, y, out) -> float  the batch's mean loss in evaluation mode, without
///                                       gradients; writes the [batch, classes] logits of the
///                                       same forward into out (resizing it), or leaves out
///                                       empty (size 0) when the model has none
template <class M>
concept evaluates_loss = model<M> && requires(M& m, std::span<const float> cp, const tensor& x, const tensor& y,
                                              tensor& out) {
  { m.evaluation_loss(cp, x, y, out) } -> std::convertible_to<float>;
};

/// has_buffers: a model with state besides its parameters that no gradient trains (BatchNorm's
/// running statistics, any buffer a LibTorch module registers), kept in the model itself
/// (optional). The chief's (a collective job: rank 0's) buffers are the job's: dtf::train
/// saves them with every checkpoint (NAME.buffers beside the checkpoint's files, written before
/// its manifest) and gives them back on a restore; a collective job broadcasts rank 0's at its
/// start (after a restore, the restored ones) and copies them into the model the caller passed
/// before each evaluation; a ps job's chief publishes its own on ps 0 (after the initialisation
/// or restore) and every worker takes them into its model at its start. For `const M cm`, `M m` and spans `out`, `in` of
/// num_parameters(cm.buffers()) floats:
///   cm.buffers()           -> std::vector<variable_spec>  names, shapes, offsets (a flat space of its own)
///   m.read_buffers(out)    copies the buffers into out (host memory)
///   m.write_buffers(in)    sets the buffers from in
template <class M>
concept has_buffers = requires(const M& cm, M& m, std::span<float> out, std::span<const float> in) {
  { cm.buffers() } -> std::convertible_to<std::vector<variable_spec>>;
  m.read_buffers(out);
  m.write_buffers(in);
};

/// adopts_parameters (optional, for models that hold state of their own, e.g. a LibTorch
/// module): dtf::train hands the job's trained values over at its end, on the chief (ps
/// strategies: the values on the ps) or every rank (collective strategies: rank 0's), so that
/// the model holds them after train() returns. For `M m` and a span `p` of num_parameters(...)
/// floats in device memory:
///   m.set_parameters(p)    takes p's values
template <class M>
concept adopts_parameters = requires(M& m, std::span<const float> p) { m.set_parameters(p); };

/// lr_schedule: a learning rate as a function of the global step.
///   s(step) -> float
template <class S>
concept lr_schedule = requires(const S& s, std::int64_t step) {
  { s(step) } -> std::convertible_to<float>;
};

/// How a strategy's tasks exchange what they learn; it fixes the shape of the job around the
/// steps (dtf::train reads it):
///   asynchronous  ps tasks hold θ̃; the chief initialises or restores them, every worker
///                 pulls and pushes when its strategy says so; a checkpoint holds the ps's
///                 variables and the ps rule's slots; the job ends when the chief has seen
///                 every worker finish and shuts the ps tasks down
///   synchronous   as asynchronous, but each global step aggregates N contributions (the
///                 ps is initialised with replicas_to_aggregate); the job ends at a global step
///   collective    no ps tasks: every rank holds the whole model; rank 0 initialises or
///                 restores and broadcasts; a checkpoint (rank 0) holds the replicated
///                 variables and the rule's slots; the ranks agree on the stop and leave
///                 together
///   hybrid        both (dtf::strategies::hybrid, embedding models only): ps tasks hold the
///                 embedding tables and nothing else; every training task is a ring rank that
///                 holds the dense variables, as collective; the ranks agree on the stop and
///                 leave together, then rank 0 shuts the ps tasks down
enum class strategy_kind { asynchronous, synchronous, collective, hybrid };

namespace detail {
/// A model that only declares its members: names engine types in unevaluated contexts.
struct model_archetype {
  std::vector<variable_spec> variables() const;
  void initialize(std::span<float>, std::uint64_t);
  float loss_and_gradients(std::span<const float>, const tensor&, const tensor&, std::span<float>);
  void logits(std::span<const float>, const tensor&, tensor&);
};
/// The gradient callback a parameter-server strategy's step receives: the mean loss of the
/// current batch at `at`, its gradient written into `grads` (host memory).
using strategy_gradient_fn = std::function<float(std::span<const float> at, std::span<float> grads)>;
}  // namespace detail

/// strategy: what dtf::train runs on every task; the value a program passes to dtf::train
/// (changing its type changes the scheme, nothing else).
///
/// Required of every strategy `S` (`S s`, `const S cs`):
///   typename S::config_type           its knobs, an aggregate with documented defaults
///   S::kind -> strategy_kind          the shape of the job (start, checkpoint, end: see above)
///
/// kind asynchronous or synchronous (through parameter servers), for `typename
/// S::state_type w` (what a step sees: θₖ, scratch, the ps client, statistics) and a gradient
/// callback `f` (detail::strategy_gradient_fn):
///   cs.ps_rule() -> optim::rule       job start: the update rule the chief initialises the ps with
///   s.begin(w)                        after the ps is ready (typically θₖ = θ̃)
///   s.step(w, f) -> float             per step: local compute, what it pulls and pushes; the loss
///   s.end(w)                          the job's end for this worker: flush what is pending
/// asynchronous also:
///   cs.lock_free() -> bool            whether the ps applies updates without locks
/// synchronous also:
///   cs.replicas_to_aggregate() -> size_t    N contributions per global step
///   cs.steps_per_contribution() -> size_t   local steps per contribution (epochs → steps)
///
/// kind hybrid (dtf/strategies/hybrid.hpp; its engine is built per task over the ring and the
/// ps client, for an embedding model):
///   cs.replicas_per_process() -> size_t     batches each process trains per step
///
/// kind collective (no ps; the strategy value describes an engine built per task):
///   cs.replicas_per_process() -> size_t     batches each process trains per step
///   typename S::template engine<M>          the per-task engine for a model M; dtf::train
///                                           builds it with cs.make(comm, model) and calls
///                                           e.initialize(seed), e.step(span of host batches)
///                                           -> float, e.global_step(), e.learning_rate(),
///                                           e.parameters(), e.optimizer() and
///                                           e.restore(values, slots, iterations, step)
///
/// Built-ins (each static_assert-ed after its definition): hogwild, downpour (DOWNPOUR-Easy
/// too), agn, dyn_sgd, aeasgd, eamsgd, sync_sgd (backups, per-worker rates), sagn,
/// ring_allreduce<>, mirrored<>. check_strategy<S>() below names what a type lacks.
template <class S>
concept strategy =
    std::move_constructible<S> && requires {
      typename S::config_type;
      { S::kind } -> std::convertible_to<strategy_kind>;
    } &&
    (S::kind == strategy_kind::collective
         ? requires(const S& cs) {
             { cs.replicas_per_process() } -> std::convertible_to<std::size_t>;
             typename S::template engine<detail::model_archetype>;
           }
     : S::kind == strategy_kind::hybrid
         ? requires(const S& cs) {
             { cs.replicas_per_process() } -> std::convertible_to<std::size_t>;
           }
         : requires(S& s, const S& cs, typename S::state_type& w, const detail::strategy_gradient_fn& f) {
             { cs.ps_rule() } -> std::convertible_to<optim::rule>;
             s.begin(w);
             { s.step(w, f) } -> std::convertible_to<float>;
             s.end(w);
           } && (S::kind != strategy_kind::asynchronous || requires(const S& cs) {
             { cs.lock_free() } -> std::convertible_to<bool>;
           }) && (S::kind != strategy_kind::synchronous || requires(const S& cs) {
             { cs.replicas_to_aggregate() } -> std::convertible_to<std::size_t>;
             { cs.steps_per_contribution() } -> std::convertible_to<std::size_t>;
           }));

/// Fails to compile with a message naming the first required expression of dtf::model that M
/// lacks (dtf::train calls it first, so a wrong model reads as one line, not a template trace).
template <class M>
consteval bool check_model() {
  static_assert(requires(const M& cm) { { cm.variables() } -> std::convertible_to<std::vector<variable_spec>>; },
                "dtf::model: missing `m.variables()` -> std::vector<dtf::variable_spec> (const member)");
  static_assert(requires(M& m, std::span<float> p, std::uint64_t s) { m.initialize(p, s); },
                "dtf::model: missing `m.initialize(std::span<float> params, std::uint64_t seed)`");
  static_assert(requires(M& m, std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g) {
                  { m.loss_and_gradients(p, x, y, g) } -> std::convertible_to<float>;
                },
                "dtf::model: missing `m.loss_and_gradients(std::span<const float> params, const dtf::tensor& x, "
                "const dtf::tensor& y, std::span<float> grads)` -> float");
  return model<M>;
}

/// Fails to compile with a message naming the first required expression of dtf::strategy
/// that S lacks (see the concept's list).
template <class S>
consteval bool check_strategy() {
  static_assert(requires { typename S::config_type; },
                "dtf::strategy: missing `using config_type = ...;` (the strategy's knobs)");
  static_assert(requires { { S::kind } -> std::convertible_to<strategy_kind>; },
                "dtf::strategy: missing `static constexpr dtf::strategy_kind kind = ...;`");
  if constexpr (requires { { S::kind } -> std::convertible_to<strategy_kind>; }) {
    if constexpr (S::kind == strategy_kind::collective) {
      static_assert(requires(const S& cs) { { cs.replicas_per_process() } -> std::convertible_to<std::size_t>; },
                    "dtf::strategy (collective): missing `s.replicas_per_process()` -> std::size_t (const member)");
      static_assert(requires { typename S::template engine<detail::model_archetype>; },
                    "dtf::strategy (collective): missing `template <dtf::model M> using engine = ...;`");
    } else if constexpr (S::kind == strategy_kind::hybrid) {
      static_assert(requires(const S& cs) { { cs.replicas_per_process() } -> std::convertible_to<std::size_t>; },
                    "dtf::strategy (hybrid): missing `s.replicas_per_process()` -> std::size_t (const member)");
    } else {
      static_assert(requires { typename S::state_type; },
                    "dtf::strategy: missing `using state_type = ...;` (what a step sees, e.g. "
                    "dtf::strategies::worker_state)");
      if constexpr (requires { typename S::state_type; }) {
        static_assert(requires(const S& cs) { { cs.ps_rule() } -> std::convertible_to<optim::rule>; },
                      "dtf::strategy: missing `s.ps_rule()` -> dtf::optim::rule (const member)");
        static_assert(requires(S& s, typename S::state_type& w) { s.begin(w); },
                      "dtf::strategy: missing `s.begin(state_type&)`");
        static_assert(requires(S& s, typename S::state_type& w, const detail::strategy_gradient_fn& f) {
                        { s.step(w, f) } -> std::convertible_to<float>;
                      },
                      "dtf::strategy: missing `s.step(state_type&, const gradient_fn&)` -> float");
        static_assert(requires(S& s, typename S::state_type& w) { s.end(w); },
                      "dtf::strategy: missing `s.end(state_type&)`");
      }
      if constexpr (S::kind == strategy_kind::asynchronous)
        static_assert(requires(const S& cs) { { cs.lock_free() } -> std::convertible_to<bool>; },
                      "dtf::strategy (asynchronous): missing `s.lock_free()` -> bool (const member)");
      if constexpr (S::kind == strategy_kind::synchronous) {
        static_assert(requires(const S& cs) { { cs.replicas_to_aggregate() } -> std::convertible_to<std::size_t>; },
                      "dtf::strategy (synchronous): missing `s.replicas_to_aggregate()` -> std::size_t (const member)");
        static_assert(requires(const S& cs) { { cs.steps_per_contribution() } -> std::convertible_to<std::size_t>; },
                      "dtf::strategy (synchronous): missing `s.steps_per_contribution()` -> std::size_t (const member)");
      }
    }
  }
  static_assert(std::move_constructible<S>, "dtf::strategy: must be move-constructible");
  return strategy<S>;
}

}  // namespace dtf
