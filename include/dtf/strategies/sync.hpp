// dtf/strategies/sync.hpp — synchronous training through parameter servers: SyncSGD with
// backup workers (Chen et al. 2016, TensorFlow's SyncReplicasOptimizer), per-worker rates,
// SAGN, and the linear scaling rule with gradual warmup (Goyal et al. 2017).
//
// Every contribution is tagged with the global step it was computed at. For each step each ps
// averages the first N = replicas_to_aggregate contributions, applies the update rule,
// advances the step and releases the contributors; a contribution for an older step (a
// straggler's, when N + b workers run) is dropped and counted per worker — TensorFlow drops
// them silently. While at least N workers are alive training continues whatever the others
// do; when a worker dies and fewer than N remain, every worker gets an error saying so.
//
// With plain SGD, N workers at batch B compute exactly the update one process computes at
// batch N·B (the mean of equal-size means is the mean).
// Communication per step: one pull and one push of the whole model per worker.
//
// An embedding model (dtf/embedding_model.hpp) trains with SyncSGD: each step a worker gathers
// its batch's rows after the pull, and its rows' gradients travel with its dense contribution;
// each ps averages the rows over the step's N contributions and applies them with the step
// (dtf/ps/sync_aggregator.hpp), so the tables advance in lockstep with θ and a straggler's
// rows are dropped with its gradient. SAGN's local steps would need local copies of the rows:
// it does not train embedding models (trains_tables).
#pragma once

#include <dtf/optim/clip.hpp>
#include <dtf/optim/schedule.hpp>
#include <dtf/strategies/async.hpp>

#include <chrono>
#include <functional>
#include <limits>
#include <thread>
#include <optional>

namespace dtf::strategies {

/// What synchronous contributions report.
struct drop_stats {
  /// Contributions made, and those the ps dropped (too stale: their step had completed).
  ///@{
  std::uint64_t contributions = 0, dropped = 0;
  ///@}
};

/// The state a synchronous step sees.
struct sync_state {
  /// θₖ, the worker's copy of the parameters, and a gradient scratch of the same size.
  ///@{
  std::span<float> params, grads;
  ///@}
  /// The client of the parameter servers.
  ps_client& ps;
  /// This worker's index.
  std::size_t worker_index = 0;
  /// The global step, as last reported by the ps.
  std::int64_t global_step = 0;
  /// The counts of this worker's contributions and drops.
  drop_stats& drops;
  /// Training ends at this global step: a worker that pulls it contributes nothing more
  /// (nobody would complete the step).
  std::int64_t last_step = std::numeric_limits<std::int64_t>::max();
  /// An embedding model's rows' gradients of the step (set by the gradient computation), to be
  /// contributed with the dense gradient; empty for a dense model.
  std::span<const sync_rows> sparse{};
  /// The worker's data position once the step's batch is trained (dtf::train sets it): sent
  /// with the contribution, ps 0 records it with the step the contribution completes, so a
  /// checkpoint of that step holds it. position_committed: the last contribution's was.
  const data::position* position = nullptr;
  /// Whether ps 0 recorded the last contribution's data position with its step.
  bool position_committed = false;
  /// Contributes gradient (or delta, when `delta`) `g` for global step `step`, with the step's
  /// rows and data position (ps_client::push_sync; the ps applies its rule at `rate` when
  /// given); returns the ps's answer.
  sync_result contribute(std::span<const float> g, std::int64_t step, std::optional<float> rate, bool delta) {
    position_committed = false;
    const auto r = ps.push_sync(g, step, rate, delta, sparse, position);
    position_committed = position && !r.dropped && !r.skipped;
    return r;
  }
  /// Records a contribution's result: the counts and the global step.
  void contributed(const sync_result& r) {
    ++drops.contributions;
    if (r.dropped) ++drops.dropped;
    global_step = r.global_step;
  }
};

/// sync_sgd's knobs.
struct sync_sgd_config {
  std::size_t replicas_to_aggregate = 1;            ///< N: contributions averaged per step
  optim::rule rule = optim::momentum{0.05f, 0.9f};  ///< applied by the ps to the average
  /// Per-worker rates (the TF guide's "different learning rates"): worker k multiplies its
  /// gradient by worker_rates[k % size()] before contributing; empty: 1 for everyone.
  std::vector<float> worker_rates{};
  /// Linear scaling rule: the rule's rate times N, reached linearly over warmup_steps.
  bool linear_scaling = false;
  /// Steps over which the scaled rate is reached (linear_scaling).
  std::int64_t warmup_steps = 0;
  /// The rate the ps applies the rule at in each global step (e.g. optim::cosine_decay), fixed
  /// with the step; empty: the rule's rate (with linear_scaling). Not with linear_scaling.
  std::function<float(std::int64_t global_step)> schedule{};
};

/// The rate of global step `step` under the config (nullopt: the rule's own rate).
inline std::optional<float> sync_rate(const sync_sgd_config& c, std::int64_t step) {
  if (c.schedule) return c.schedule(step);
  if (!c.linear_scaling) return std::nullopt;
  const float base = std::visit([](const auto& r) { return r.learning_rate; }, c.rule);
  return optim::linear_scaling_warmup{.base_rate = base,
                                      .scale = float(c.replicas_to_aggregate),
                                      .warmup_steps = c.warmup_steps}(step);
}

/// SyncSGD: pull θ̃ (and the step t), compute g, contribute g (scaled by this worker's rate)
/// for step t, wait for the step to complete.
class sync_sgd {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = sync_sgd_config;
  using state_type = sync_state;  ///< dtf::strategy: what a step sees
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::synchronous;
  static constexpr bool contributes_rows = true;  ///< trains embedding models (w.sparse)
  /// A strategy with the given knobs. Errors: errc::invalid_config when replicas_to_aggregate
  /// is 0.
  explicit sync_sgd(config_type c = {}) : c_(std::move(c)) {
    if (c_.replicas_to_aggregate == 0) throw error(errc::invalid_config, "sync_sgd: replicas_to_aggregate must be positive");
    if (c_.schedule && c_.linear_scaling)
      throw error(errc::invalid_config, "sync_sgd: a schedule and linear_scaling together (fold the scaling into the "
                                        "schedule)");
  }
  /// dtf::strategy: the update rule the chief initialises the ps with.
  optim::rule ps_rule() const { return c_.rule; }
  /// dtf::strategy (synchronous): the contributions each global step aggregates.
  std::size_t replicas_to_aggregate() const { return c_.replicas_to_aggregate; }
  /// Local steps per contribution (the examples count global steps with it).
  std::size_t steps_per_contribution() const { return 1; }
  /// dtf::strategy: after the ps is ready, and after a recovery: (re)starts this worker's scheme.
  void begin(sync_state&) {}
  /// dtf::strategy: one local step: the gradient through `grad`, the pulls and pushes the scheme
  /// makes; returns the batch's loss.
  float step(sync_state& w, const gradient_fn& grad) {
    const std::int64_t t = w.ps.pull(w.params);
    if (t >= w.last_step) {
      w.global_step = t;
      return 0.0f;
    }
    const float loss = grad(w.params, w.grads);
    if (!c_.worker_rates.empty()) {
      const float rate = c_.worker_rates[w.worker_index % c_.worker_rates.size()];
      for (auto& g : w.grads) g *= rate;
      for (const auto& r : w.sparse)
        for (auto& g : r.rows) g *= rate;
    }
    w.contributed(w.contribute(w.grads, t, sync_rate(c_, t), false));
    return loss;
  }
  /// dtf::strategy: the job's end for this worker: flushes what is pending.
  void end(sync_state&) {}

 private:
  config_type c_;
};

/// sagn's knobs.
struct sagn_config {
  std::size_t replicas_to_aggregate = 1;        ///< N
  std::size_t window = 5;                       ///< λ local steps per contribution (TF guide: 5)
  optim::rule local_rule = optim::adam{1e-3f};  ///< the worker's optimiser (TF guide: Adam)
  /// The local rule's rate at the global step the window was pulled at (e.g.
  /// optim::cosine_decay); empty: the rule's own rate.
  std::function<float(std::int64_t global_step)> schedule{};
};

/// SAGN (the TF guide's synchronous AGN): λ local steps from the pulled θ̃, then contribute
/// the window's mean update (θₖ − θ_pulled)/λ; the ps adds the average of N contributions.
class sagn {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = sagn_config;
  using state_type = sync_state;  ///< dtf::strategy: what a step sees
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::synchronous;
  /// A strategy with the given knobs. Errors: errc::invalid_config when window or
  /// replicas_to_aggregate is 0.
  explicit sagn(config_type c = {}) : c_(std::move(c)) {
    if (c_.window == 0 || c_.replicas_to_aggregate == 0)
      throw error(errc::invalid_config, "sagn: window and replicas_to_aggregate must be positive");
  }
  /// dtf::strategy: the update rule the chief initialises the ps with.
  optim::rule ps_rule() const { return optim::sgd{}; }  // contributions are deltas
  /// dtf::strategy (synchronous): the contributions each global step aggregates.
  std::size_t replicas_to_aggregate() const { return c_.replicas_to_aggregate; }
  /// dtf::strategy (synchronous): local steps per contribution.
  std::size_t steps_per_contribution() const { return c_.window; }
  /// dtf::strategy: after the ps is ready, and after a recovery: (re)starts this worker's scheme.
  void begin(sync_state& w) {
    local_ = std::make_unique<detail::host_optimizer>(c_.local_rule, w.params.size());
    pulled_.assign(w.params.size(), 0.0f);
    delta_.assign(w.params.size(), 0.0f);
  }
  /// dtf::strategy: one local step: the gradient through `grad`, the pulls and pushes the scheme
  /// makes; returns the batch's loss.
  float step(sync_state& w, const gradient_fn& grad) {
    if (count_ == 0) {
      t_ = w.ps.pull(w.params);
      if (t_ >= w.last_step) {
        w.global_step = t_;
        return 0.0f;
      }
      std::copy(w.params.begin(), w.params.end(), pulled_.begin());
    }
    const float loss = grad(w.params, w.grads);
    detail::local_step(*local_, w.params, w.grads, c_.schedule ? std::optional<float>(c_.schedule(t_)) : std::nullopt);
    if (++count_ >= c_.window) {
      count_ = 0;  // a new window even if the contribution below fails
      const float inv = 1.0f / float(c_.window);
      for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = (w.params[i] - pulled_[i]) * inv;
      w.contributed(w.contribute(delta_, t_, std::nullopt, /*delta=*/true));
    }
    return loss;
  }
  /// dtf::strategy: the job's end for this worker: flushes what is pending.
  void end(sync_state&) {}

 private:
  config_type c_;
  std::unique_ptr<detail::host_optimizer> local_;
  std::vector<float> pulled_, delta_;
  std::size_t count_ = 0;
  std::int64_t t_ = 0;
};

/// sync_strategy: like async_strategy, over sync_state, plus replicas_to_aggregate() and
/// steps_per_contribution().
template <class S>
concept sync_strategy = requires(S& s, const S& cs, sync_state& w, const gradient_fn& f) {
  typename S::config_type;
  { cs.ps_rule() } -> std::convertible_to<optim::rule>;
  { cs.replicas_to_aggregate() } -> std::convertible_to<std::size_t>;
  { cs.steps_per_contribution() } -> std::convertible_to<std::size_t>;
  s.begin(w);
  { s.step(w, f) } -> std::convertible_to<float>;
  s.end(w);
};
static_assert(sync_strategy<sync_sgd>);
static_assert(check_strategy<sync_sgd>(), "sync_sgd must model dtf::strategy: config_type, state_type, kind, ps_rule(), "
                                     "replicas_to_aggregate(), steps_per_contribution(), begin(w), step(w, f) -> float, end(w)");
/// Whether strategy S trains an embedding model (tables on the ps): the asynchronous ones, a
/// synchronous one that contributes the rows with its steps (contributes_rows), and hybrid.
template <class S>
concept trains_tables = S::kind == strategy_kind::asynchronous || S::kind == strategy_kind::hybrid ||
                        requires { requires S::contributes_rows; };
static_assert(trains_tables<sync_sgd> && !trains_tables<sagn>);
static_assert(sync_strategy<sagn>);
static_assert(check_strategy<sagn>(), "sagn must model dtf::strategy: config_type, state_type, kind, ps_rule(), "
                                     "replicas_to_aggregate(), steps_per_contribution(), begin(w), step(w, f) -> float, end(w)");

/// Drives a synchronous strategy for one worker (as async_worker does for asynchronous ones).
/// M is a dtf::model, or a dtf::embedding_model when S contributes rows (trains_tables).
template <sync_strategy S, class M>
  requires model<M> || (embedding_model<M> && trains_tables<S>)
class sync_worker {
 public:
  sync_worker(const sync_worker&) = delete;  // state_ refers to this object's buffers
  sync_worker& operator=(const sync_worker&) = delete;
  /// The worker `worker_index`, training model `m` through the ps client `ps`.
  sync_worker(S strategy, M& m, ps_client& ps, std::size_t worker_index)
      : strategy_(std::move(strategy)),
        model_(m),
        n_(num_parameters(m.variables())),
        params_(n_),
        grads_(n_),
        state_{params_, grads_, ps, worker_index, 0, drops_},
        gradient_(detail::gradient_of<M>::make(m, n_, ps)) {
    if constexpr (embedding_model<M>) gradient_.keep_rows();
  }

  /// The chief's initialisation of the ps for synchronous training (an embedding model's tables
  /// first, with the embedding rule); with num_workers > 0 the ps refuses a
  /// replicas_to_aggregate above it (no step could complete).
  void initialize_ps(std::uint64_t seed, std::size_t num_workers = 0) {
    if constexpr (embedding_model<M>) create_tables();
    detail::initialize_centre(model_, params_, state_.ps, seed,
                              {.rule = strategy_.ps_rule(),
                               .replicas_to_aggregate = strategy_.replicas_to_aggregate(),
                               .num_workers = num_workers});
  }

  /// Before the first step (and after a recovery): the strategy's begin().
  void begin() { strategy_.begin(state_); }
  /// One step on a host batch; returns the batch's loss.
  float step(const data::host_batch& b) {
    gradient_.set_batch(b);
    state_.position_committed = false;  // a step without a contribution records nothing
    return strategy_.step(state_, [this](std::span<const float> at, std::span<float> g) {
      // Simulated slow hardware (tests and benchmarks of stragglers), inside the computation,
      // so the contribution is computed from parameters that go stale meanwhile.
      if (before_compute_) before_compute_();
      if (compute_delay_.count() > 0) std::this_thread::sleep_for(compute_delay_);
      const float loss = gradient_(at, g);
      if (clip_norm_ > 0.0f) optim::clip_by_global_norm<optim::host_space>(g, clip_norm_);
      if constexpr (embedding_model<M>) state_.sparse = gradient_.contribution();
      return loss;
    });
  }
  /// After the last step: the strategy's end().
  void end() { strategy_.end(state_); }
  /// Clips each batch's gradient as async_worker::set_clip_norm (this worker's own gradient,
  /// before it is contributed: not the ps's average).
  void set_clip_norm(float max_norm) {
    clip_norm_ = optim::checked_worker_clip_norm(max_norm, embedding_model<M>);
  }

  /// Makes every gradient computation take `delay` longer: a straggler, for tests and
  /// benchmarks (the examples' --slow_ms flag).
  void set_compute_delay(std::chrono::milliseconds delay) noexcept { compute_delay_ = delay; }
  /// Runs `f` at the start of every gradient computation, after the pull it computes from (a
  /// test's hook to order a straggler's steps against the others').
  void set_before_compute(std::function<void()> f) { before_compute_ = std::move(f); }
  /// The data position sent with the next contribution (nullptr: none; sync_state::position),
  /// and whether ps 0 recorded the last one with its step.
  void set_position(const data::position* at) noexcept { state_.position = at; }
  /// Whether ps 0 recorded the last contribution's data position with its step.
  bool position_committed() const noexcept { return state_.position_committed; }

  /// Training ends when the global step reaches `step`.
  void set_last_step(std::int64_t step) noexcept { state_.last_step = step; }
  /// Whether the global step reached the last step (set_last_step()).
  bool finished() const noexcept { return state_.global_step >= state_.last_step; }
  /// The global step, as last reported by the ps.
  std::int64_t global_step() const noexcept { return state_.global_step; }
  /// The counts of this worker's contributions and drops.
  const drop_stats& drops() const noexcept { return drops_; }
  /// θₖ, the worker's parameters (host memory).
  std::span<float> params() noexcept { return params_; }
  /// The strategy this worker drives.
  S& strategy() noexcept { return strategy_; }
  /// An embedding model's tables, as async_worker's.
  void set_embedding_rule(optim::rule r) requires embedding_model<M> { gradient_.set_rule(std::move(r)); }
  /// The chief's creation of the tables on every ps (see set_embedding_rule()).
  void create_tables() requires embedding_model<M> { gradient_.create_tables(strategy_.ps_rule()); }
  /// This worker's view of the tables (see set_embedding_rule()).
  embedding_tables& tables() requires embedding_model<M> { return gradient_.tables(); }

 private:
  S strategy_;
  M& model_;
  std::size_t n_;
  std::vector<float> params_, grads_;
  drop_stats drops_;
  sync_state state_;
  typename detail::gradient_of<M>::type gradient_;
  std::chrono::milliseconds compute_delay_{0};
  std::function<void()> before_compute_;
  float clip_norm_ = 0.0f;
};

}  // namespace dtf::strategies
