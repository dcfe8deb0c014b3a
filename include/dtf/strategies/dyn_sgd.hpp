// dtf/strategies/dyn_sgd.hpp — DynSGD (Jiang, Cui, Zhang, Yu 2017, "Heterogeneity-aware
// Distributed Parameter Servers").
//
// As AGN's window, but the worker commits the unnormalised residual r = θₖ − θ_pulled, and the
// ps scales it by 1 / (τ + 1), τ being the number of updates it applied since this worker's
// pull: stale commits count less. With one worker τ = 0 and commits are added whole.
// staleness_aware = false adds every residual whole (no scaling).
// Communication per window: one push and one pull of the whole model every `window` steps.
#pragma once

#include <dtf/strategies/window.hpp>

#include <cstdint>
#include <functional>
#include <optional>

namespace dtf::strategies {

/// dyn_sgd's knobs.
struct dyn_sgd_config {
  std::size_t window = 5;                       ///< local steps per commit (dist-keras: 5)
  optim::rule local_rule = optim::adam{1e-3f};  ///< the worker's optimiser
  bool staleness_aware = true;  ///< the ps scales each commit by 1 / (τ + 1) (false: adds it whole)
  /// The local rule's rate at the global step the worker last saw (e.g. optim::cosine_decay);
  /// empty: the rule's own rate.
  std::function<float(std::int64_t global_step)> schedule{};
};

/// DynSGD (Jiang et al. 2017): as agn's window, but the worker commits the residual θₖ − θ_pulled
/// and the ps scales it by 1 / (τ + 1), τ being the updates it applied since this worker's pull.
/// A dtf::strategy of kind asynchronous.
class dyn_sgd {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = dyn_sgd_config;
  using state_type = worker_state;  ///< dtf::strategy: what a step sees
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::asynchronous;
  /// A strategy with the given knobs. Errors: errc::invalid_config when window is 0.
  explicit dyn_sgd(config_type c = {}) : c_(std::move(c)) {
    if (c_.window == 0) throw error(errc::invalid_config, "dyn_sgd: window must be positive");
  }

  /// dtf::strategy: the update rule the chief initialises the ps with.
  optim::rule ps_rule() const { return optim::sgd{}; }  // commits are deltas
  /// dtf::strategy (asynchronous): whether the ps applies updates without locks.
  bool lock_free() const { return false; }
  /// dtf::strategy: after the ps is ready, and after a recovery: (re)starts this worker's scheme.
  void begin(worker_state& w) { win_.begin(w, c_.local_rule); }
  /// dtf::strategy: one local step: the gradient through `grad`, the pulls and pushes the scheme
  /// makes; returns the batch's loss.
  float step(worker_state& w, const gradient_fn& grad) {
    const float loss = win_.step(w, grad, c_.schedule ? std::optional<float>(c_.schedule(w.global_step)) : std::nullopt);
    if (win_.count() == c_.window) commit(w);
    return loss;
  }
  /// The setting to change when the update is unstable at the measured staleness
  /// (dtf/strategies/staleness_watch.hpp).
  const char* stability_setting() const noexcept {
    return c_.staleness_aware ? "--lr (the rate of dyn_sgd_config::local_rule): lower it"
                              : "--staleness_aware (dyn_sgd_config::staleness_aware): turn it on, or lower --lr";
  }
  /// dtf::strategy: the job's end for this worker: flushes what is pending.
  void end(worker_state& w) {
    if (win_.count() > 0) commit(w);
  }

 private:
  void commit(worker_state& w) {
    w.pushed(w.ps.push_deltas(win_.residual(w, 1.0f), true, c_.staleness_aware));
    win_.repull(w);
  }

  config_type c_;
  detail::local_window win_;
};
static_assert(async_strategy<dyn_sgd>);
static_assert(check_strategy<dyn_sgd>(), "dyn_sgd must model dtf::strategy: config_type, state_type, kind, ps_rule(), lock_free(), "
                                     "begin(w), step(w, f) -> float, end(w) (see dtf/concepts.hpp)");

}  // namespace dtf::strategies
