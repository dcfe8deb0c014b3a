// dtf/strategies/async.hpp — what the asynchronous parameter-server strategies share: the
// async_strategy concept, the state a step sees, staleness statistics, and async_worker, which
// drives a strategy over a stream of batches.
//
// An asynchronous strategy decides, per local step, what a worker computes, when it pulls the
// centre variable θ̃ from the parameter servers, and what it pushes (gradients the ps applies
// with its update rule, or deltas the ps adds). Built-ins, one header each: hogwild, downpour
// (and DOWNPOUR-Easy), agn, dyn_sgd, aeasgd, eamsgd.
//
// Buffers: θₖ and every buffer a strategy keeps are host memory (std::vector<float>), because
// they are sent to and received from the parameter servers. On CPU builds the model computes
// on them directly; on CUDA builds async_worker copies through device tensors.
// Thread safety: one async_worker per thread (several in one process are fine: each has its
// own model instance and ps_client).
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/host.hpp>
#include <dtf/optim/clip.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/ps.hpp>
#include <dtf/strategies/embedding_gradient.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace dtf::strategies {

/// How many updates each push missed (updates the ps applied since this worker's last pull).
struct staleness_stats {
  /// Pushes recorded, the sum of their staleness, and the largest.
  ///@{
  std::uint64_t pushes = 0, sum = 0, max = 0;
  ///@}
  /// Records one push's staleness.
  void record(std::uint64_t s) noexcept {
    ++pushes;
    sum += s;
    max = std::max(max, s);
  }
  /// The mean staleness of the pushes (0 before the first).
  double mean() const noexcept { return pushes ? double(sum) / double(pushes) : 0.0; }
};

/// Computes the mean loss of the current batch at parameters `at` and writes its gradient
/// into `grads` (both host memory, num_parameters floats).
using gradient_fn = std::function<float(std::span<const float> at, std::span<float> grads)>;

/// What a strategy's step sees. params is θₖ, the worker's own copy.
struct worker_state {
  /// θₖ, the worker's own copy of the parameters.
  std::span<float> params;
  std::span<float> grads;  ///< scratch of the same size
  /// The client of the parameter servers.
  ps_client& ps;
  /// This worker's index among the workers, and their number.
  ///@{
  std::size_t worker_index = 0, num_workers = 1;
  ///@}
  /// The epoch of the current batch.
  std::size_t epoch = 0;
  std::int64_t local_step = 0;  ///< steps this worker has taken before the current one
  std::int64_t global_step = 0;  ///< as last reported by the ps
  /// The staleness of this worker's pushes.
  staleness_stats& staleness;

  /// Records a push's result.
  void pushed(const push_result& r) {
    staleness.record(r.staleness);
    global_step = r.global_step;
  }
};

/// async_strategy: a worker-side policy for asynchronous training through parameter servers.
///
/// Required expressions, for `S s` (constructed from its `S::config_type`), `worker_state w`
/// and `gradient_fn f`:
///   s.ps_rule()     -> optim::rule   the update rule the ps applies to pushed gradients
///   s.lock_free()   -> bool          whether the ps applies updates without locks
///   s.begin(w)                       after the ps is initialised (typically: pull θₖ = θ̃)
///   s.step(w, f)    -> float         one local step on the current batch; returns its loss
///   s.end(w)                         after the last batch (flush what is pending)
template <class S>
concept async_strategy = requires(S& s, const S& cs, worker_state& w, const gradient_fn& f) {
  typename S::config_type;
  { cs.ps_rule() } -> std::convertible_to<optim::rule>;
  { cs.lock_free() } -> std::convertible_to<bool>;
  s.begin(w);
  { s.step(w, f) } -> std::convertible_to<float>;
  s.end(w);
};

namespace detail {
/// Host memory used by the strategies' element-wise arithmetic.
using host_optimizer = optim::optimizer<optim::host_space>;

/// A local optimiser step that reads and writes host memory.
inline void local_step(host_optimizer& opt, std::span<float> params, std::span<const float> grads,
                       std::optional<float> lr = std::nullopt) {
  if (lr)
    opt.apply(params, grads, *lr);
  else
    opt.apply(params, grads);
}
/// The model's loss and gradient on the current batch at host parameters `at`.
template <model M>
class batch_gradient {
 public:
  batch_gradient(M& m, std::size_t n) : model_(m), staging_(n) {}
  void set_batch(const data::host_batch& b) { staging_.set_batch(x_, b.features, y_, b.labels, model_stream(model_)); }
  float operator()(std::span<const float> at, std::span<float> g) {
    return staging_(at, g, [&](std::span<const float> p, std::span<float> dg) {
      if constexpr (defers_loss<M>) {  // the loss comes back with the gradient: one host wait
        model_.enqueue_loss_and_gradients(p, x_, y_, dg, gradient_ready_fn{});
        return model_.device_loss();
      } else {
        return model_.loss_and_gradients(p, x_, y_, dg);
      }
    }, model_stream(model_));
  }

 private:
  M& model_;
  dense_staging staging_;
  tensor x_, y_;
};
/// The chief's initialisation of the parameter servers: θ̃ = the model's seeded initial values
/// (also left in host buffer `params`), with the given rule and mode.
template <class M>
void initialize_centre(M& m, std::span<float> params, ps_client& ps, std::uint64_t seed, const ps_config& config) {
  tensor p({params.size()});
  m.initialize(p.span<float>(), seed);
  p.copy_to_host<float>(params);
  ps.initialize(params, config);
}

/// The gradient computation of a model: batch_gradient, or embedding_gradient for a model
/// with tables on the ps.
template <class M, bool Embedding = embedding_model<M>>
struct gradient_of {
  using type = batch_gradient<M>;
  static type make(M& m, std::size_t n, ps_client&) { return type(m, n); }
};
template <class M>
struct gradient_of<M, true> {
  using type = embedding_gradient<M>;
  static type make(M& m, std::size_t n, ps_client& ps) { return type(m, n, ps); }
};
}  // namespace detail

/// Drives a strategy for one worker: converts host batches to device tensors, computes
/// gradients with the model, and keeps θₖ and the staleness statistics.
/// M is a dtf::model, or a dtf::embedding_model whose tables the worker gathers from and pushes
/// to every step (dtf/strategies/embedding_gradient.hpp) while the strategy moves θ.
template <async_strategy S, class M>
  requires model<M> || embedding_model<M>
class async_worker {
 public:
  async_worker(const async_worker&) = delete;  // state_ refers to this object's buffers
  async_worker& operator=(const async_worker&) = delete;
  /// The worker `worker_index` of `num_workers`, training model `m` through the ps client `ps`.
  async_worker(S strategy, M& m, ps_client& ps, std::size_t worker_index, std::size_t num_workers)
      : strategy_(std::move(strategy)),
        model_(m),
        n_(num_parameters(m.variables())),
        params_(n_),
        grads_(n_),
        state_{params_, grads_, ps, worker_index, num_workers, 0, 0, 0, staleness_},
        gradient_(detail::gradient_of<M>::make(m, n_, ps)) {}

  /// The chief's initialisation of the ps: θ̃ = initial values, with the strategy's rule; an
  /// embedding model's tables first (so that no worker finds the ps ready without them), with
  /// the embedding rule (set_embedding_rule; the strategy's ps rule by default).
  void initialize_ps(std::uint64_t seed) {
    if constexpr (embedding_model<M>) create_tables();
    detail::initialize_centre(model_, params_, state_.ps, seed,
                              {.rule = strategy_.ps_rule(),
                               .mode = strategy_.lock_free() ? apply_mode::lock_free : apply_mode::locked});
  }

  /// Before the first step (and after a recovery): the strategy's begin().
  void begin() { strategy_.begin(state_); }

  /// One step on a host batch; returns the batch's loss.
  float step(const data::host_batch& b) {
    gradient_.set_batch(b);
    state_.epoch = b.epoch;
    const float loss = strategy_.step(state_, [this](std::span<const float> at, std::span<float> g) {
      const float l = gradient_(at, g);
      if (clip_norm_ > 0.0f) optim::clip_by_global_norm<optim::host_space>(g, clip_norm_);
      return l;
    });
    ++state_.local_step;
    return loss;
  }

  /// After the last step: the strategy's end(), which flushes what is pending.
  void end() { strategy_.end(state_); }
  /// Clips each batch's gradient to global L2 norm `max_norm` before the strategy sees it (this
  /// worker's own gradient, not what the ps aggregates; 0: off). Errors: errc::invalid_config
  /// for a negative norm or an embedding model (its rows' gradients would escape the norm).
  void set_clip_norm(float max_norm) {
    clip_norm_ = optim::checked_worker_clip_norm(max_norm, embedding_model<M>);
  }

  /// The staleness of this worker's pushes so far.
  const staleness_stats& staleness() const noexcept { return staleness_; }
  /// θₖ, the worker's parameters (host memory).
  std::span<float> params() noexcept { return params_; }
  /// An embedding model's tables: the rule the ps apply to their rows (the strategy's ps rule
  /// unless set), their creation on every ps by the chief (a ps that holds one keeps its rows;
  /// before a restore, which fills them), this worker's view of them.
  void set_embedding_rule(optim::rule r) requires embedding_model<M> { gradient_.set_rule(std::move(r)); }
  /// The chief's creation of the tables on every ps (see set_embedding_rule()).
  void create_tables() requires embedding_model<M> { gradient_.create_tables(strategy_.ps_rule()); }
  /// This worker's view of the tables (see set_embedding_rule()).
  embedding_tables& tables() requires embedding_model<M> { return gradient_.tables(); }
  /// The global step, as last reported by the ps.
  std::int64_t global_step() const noexcept { return state_.global_step; }
  /// The strategy this worker drives.
  S& strategy() noexcept { return strategy_; }

 private:
  S strategy_;
  M& model_;
  std::size_t n_;
  std::vector<float> params_, grads_;
  staleness_stats staleness_;
  worker_state state_;
  typename detail::gradient_of<M>::type gradient_;
  float clip_norm_ = 0.0f;
};

}  // namespace dtf::strategies
