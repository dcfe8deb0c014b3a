// dtf/strategies/aeasgd.hpp — Asynchronous Elastic Averaging SGD (Zhang, Choromanska, LeCun
// 2015, "Deep learning with Elastic Averaging SGD").
//
// Every step the worker takes a local SGD step. Every τ steps it pulls the centre θ̃, computes
// the elastic difference E = α (θₖ − θ̃) with α = η ρ, moves itself by −E and pushes E, which
// the ps adds: worker and centre are pulled towards each other by the same amount.
// Staleness-aware (the default): with p workers α = min(η ρ, β / p), β = 0.9 — the paper's
// β = p α, which keeps the centre a moving average of the p workers however many there are.
// Communication per window: one pull and one push of the whole model every τ steps.
#pragma once

#include <dtf/strategies/async.hpp>

#include <algorithm>

namespace dtf::strategies {

/// aeasgd's knobs.
struct aeasgd_config {
  std::size_t window = 32;      ///< τ: local steps between elastic updates (dist-keras: 32)
  float learning_rate = 0.1f;   ///< η of the local SGD steps (dist-keras: 0.1, so α = 0.5)
  float rho = 5.0f;             ///< ρ: elasticity; α = η ρ must stay below 1
  float beta = 0.9f;            ///< β: with staleness_aware, α ≤ β / p for p workers (the paper's 0.9)
  bool staleness_aware = true;  ///< α = min(η ρ, β / p) (false: α = η ρ at any p)
};

namespace detail {
/// The elastic step shared by AEASGD and EAMSGD: E = α (θₖ − θ̃); θₖ −= E; push E.
class elastic {
 public:
  void begin(worker_state& w) {
    centre_.assign(w.params.size(), 0.0f);
    e_.assign(w.params.size(), 0.0f);
    w.ps.pull(w.params);
  }
  void apply(worker_state& w, float alpha) {
    w.ps.pull(centre_);
    for (std::size_t i = 0; i < e_.size(); ++i) {
      e_[i] = alpha * (w.params[i] - centre_[i]);
      w.params[i] -= e_[i];
    }
    w.pushed(w.ps.push_deltas(e_));
  }
  std::span<const float> last_elastic_difference() const noexcept { return e_; }

 private:
  std::vector<float> centre_, e_;
};

inline void check_alpha(float eta, float rho, float beta, const char* who) {
  const float alpha = eta * rho;
  if (!(alpha > 0.0f && alpha < 1.0f))
    throw error(errc::invalid_config, std::string(who) + ": alpha = learning_rate * rho = " + std::to_string(alpha) +
                                          " must lie in (0, 1)");
  if (!(beta > 0.0f && beta < 1.0f))
    throw error(errc::invalid_config, std::string(who) + ": beta = " + std::to_string(beta) + " must lie in (0, 1)");
}
/// The elastic step's α for p workers: η ρ, or with staleness_aware min(η ρ, β / p).
inline float elastic_alpha(float eta, float rho, float beta, bool staleness_aware, std::size_t p) noexcept {
  const float alpha = eta * rho;
  return staleness_aware ? std::min(alpha, beta / float(std::max<std::size_t>(p, 1))) : alpha;
}
}  // namespace detail

/// Asynchronous Elastic Averaging SGD (Zhang, Choromanska, LeCun 2015): local SGD steps; every τ
/// steps the worker pulls the centre θ̃, moves itself by −E and pushes E = α (θₖ − θ̃),
/// α = η ρ, which the ps adds. A dtf::strategy of kind asynchronous.
class aeasgd {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = aeasgd_config;
  using state_type = worker_state;  ///< dtf::strategy: what a step sees
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::asynchronous;
  /// A strategy with the given knobs. Errors: errc::invalid_config when window is 0 or
  /// α = learning_rate × rho or beta is not in (0, 1).
  explicit aeasgd(config_type c = {}) : c_(c) {
    if (c_.window == 0) throw error(errc::invalid_config, "aeasgd: window must be positive");
    detail::check_alpha(c_.learning_rate, c_.rho, c_.beta, "aeasgd");
  }

  /// dtf::strategy: the update rule the chief initialises the ps with.
  optim::rule ps_rule() const { return optim::sgd{}; }  // elastic differences are deltas
  /// dtf::strategy (asynchronous): whether the ps applies updates without locks.
  bool lock_free() const { return false; }
  /// The elastic step's α with `num_workers` workers: η ρ, or min(η ρ, β / p) when staleness-aware.
  float alpha(std::size_t num_workers) const noexcept {
    return detail::elastic_alpha(c_.learning_rate, c_.rho, c_.beta, c_.staleness_aware, num_workers);
  }
  /// dtf::strategy: after the ps is ready, and after a recovery: (re)starts this worker's scheme.
  void begin(worker_state& w) { elastic_.begin(w); }
  /// dtf::strategy: one local step: the gradient through `grad`, the pulls and pushes the scheme
  /// makes; returns the batch's loss.
  float step(worker_state& w, const gradient_fn& grad) {
    const float loss = grad(w.params, w.grads);
    for (std::size_t i = 0; i < w.params.size(); ++i) w.params[i] -= c_.learning_rate * w.grads[i];
    if ((w.local_step + 1) % std::int64_t(c_.window) == 0) elastic_.apply(w, alpha(w.num_workers));
    return loss;
  }
  /// The setting to change when the update is unstable at the measured staleness
  /// (dtf/strategies/staleness_watch.hpp).
  const char* stability_setting() const noexcept {
    return c_.staleness_aware ? "--beta (aeasgd_config::beta): lower it, or lower --lr"
                              : "--staleness_aware (aeasgd_config::staleness_aware): turn it on, or lower --rho";
  }
  /// dtf::strategy: the job's end for this worker: flushes what is pending.
  void end(worker_state&) {}
  /// The elastic exchange's state (for tests).
  const detail::elastic& elastic_state() const noexcept { return elastic_; }

 private:
  config_type c_;
  detail::elastic elastic_;
};
static_assert(async_strategy<aeasgd>);
static_assert(check_strategy<aeasgd>(), "aeasgd must model dtf::strategy: config_type, state_type, kind, ps_rule(), lock_free(), "
                                     "begin(w), step(w, f) -> float, end(w) (see dtf/concepts.hpp)");

}  // namespace dtf::strategies
