// dtf/strategies/eamsgd.hpp — Elastic Averaging Momentum SGD (Zhang et al. 2015): AEASGD's
// elastic step with Nesterov momentum on the worker:
//   v ← μ v − η ∇L(θₖ + μ v);  θₖ ← θₖ + v
// (the gradient is taken at the look-ahead point θₖ + μ v; dist-keras's version had the sign
// of the look-ahead wrong). Every τ steps: E = α (θₖ − θ̃), θₖ −= E, push E; α = η ρ, or
// (staleness-aware, the default) α = min(η ρ, β / p) with p workers, as aeasgd.
// Communication per window: one pull and one push of the whole model every τ steps.
#pragma once

#include <dtf/strategies/aeasgd.hpp>

namespace dtf::strategies {

/// eamsgd's knobs.
struct eamsgd_config {
  std::size_t window = 32;      ///< τ
  float learning_rate = 0.01f;  ///< η
  float momentum = 0.9f;        ///< μ (the paper suggests up to 0.99)
  float rho = 5.0f;             ///< ρ; α = η ρ
  float beta = 0.9f;            ///< β: with staleness_aware, α ≤ β / p for p workers
  bool staleness_aware = true;  ///< α = min(η ρ, β / p) (false: α = η ρ at any p)
};

/// Elastic Averaging Momentum SGD (Zhang et al. 2015): aeasgd's elastic step with Nesterov
/// momentum on the worker. A dtf::strategy of kind asynchronous.
class eamsgd {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = eamsgd_config;
  using state_type = worker_state;  ///< dtf::strategy: what a step sees
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::asynchronous;
  /// A strategy with the given knobs. Errors: errc::invalid_config when window is 0 or
  /// α = learning_rate × rho or beta is not in (0, 1).
  explicit eamsgd(config_type c = {}) : c_(c) {
    if (c_.window == 0) throw error(errc::invalid_config, "eamsgd: window must be positive");
    detail::check_alpha(c_.learning_rate, c_.rho, c_.beta, "eamsgd");
  }

  /// dtf::strategy: the update rule the chief initialises the ps with.
  optim::rule ps_rule() const { return optim::sgd{}; }
  /// dtf::strategy (asynchronous): whether the ps applies updates without locks.
  bool lock_free() const { return false; }
  /// The elastic step's α with `num_workers` workers (see aeasgd::alpha).
  float alpha(std::size_t num_workers) const noexcept {
    return detail::elastic_alpha(c_.learning_rate, c_.rho, c_.beta, c_.staleness_aware, num_workers);
  }
  /// dtf::strategy: after the ps is ready, and after a recovery: (re)starts this worker's scheme.
  void begin(worker_state& w) {
    v_.assign(w.params.size(), 0.0f);
    ahead_.assign(w.params.size(), 0.0f);
    elastic_.begin(w);
  }
  /// dtf::strategy: one local step: the gradient through `grad`, the pulls and pushes the scheme
  /// makes; returns the batch's loss.
  float step(worker_state& w, const gradient_fn& grad) {
    for (std::size_t i = 0; i < ahead_.size(); ++i) ahead_[i] = w.params[i] + c_.momentum * v_[i];
    const float loss = grad(ahead_, w.grads);
    for (std::size_t i = 0; i < v_.size(); ++i) {
      v_[i] = c_.momentum * v_[i] - c_.learning_rate * w.grads[i];
      w.params[i] += v_[i];
    }
    if ((w.local_step + 1) % std::int64_t(c_.window) == 0) elastic_.apply(w, alpha(w.num_workers));
    return loss;
  }
  /// The setting to change when the update is unstable at the measured staleness
  /// (dtf/strategies/staleness_watch.hpp).
  const char* stability_setting() const noexcept {
    return c_.staleness_aware ? "--beta (eamsgd_config::beta): lower it, or lower --lr"
                              : "--staleness_aware (eamsgd_config::staleness_aware): turn it on, or lower --rho";
  }
  /// dtf::strategy: the job's end for this worker: flushes what is pending.
  void end(worker_state&) {}

 private:
  config_type c_;
  std::vector<float> v_, ahead_;
  detail::elastic elastic_;
};
static_assert(async_strategy<eamsgd>);
static_assert(check_strategy<eamsgd>(), "eamsgd must model dtf::strategy: config_type, state_type, kind, ps_rule(), lock_free(), "
                                     "begin(w), step(w, f) -> float, end(w) (see dtf/concepts.hpp)");

}  // namespace dtf::strategies
