// dtf/strategies/agn.hpp — Accumulated Gradient Normalization (Hermans, Spanakis, Möckel
// 2017; "ADAG" in dist-keras).
//
// After pulling θ̃ into θₖ the worker takes λ steps with its local optimiser, then commits
// (θₖ − θ_pulled) / λ — the mean of its window's updates — which the ps adds to θ̃, and pulls
// again. With λ = 1 and plain SGD locally, one worker's AGN is SGD on the ps. The normalisation
// by λ is AGN's staleness rule (a commit carries one mean step, however many local steps it
// took); staleness_aware = false commits the raw residual θₖ − θ_pulled instead.
// Communication per window: one push and one pull of the whole model every λ steps.
#pragma once

#include <dtf/strategies/window.hpp>

#include <cstdint>
#include <functional>
#include <optional>

namespace dtf::strategies {

/// agn's knobs.
struct agn_config {
  std::size_t window = 10;                      ///< λ: local steps per commit (dist-keras 5–12)
  optim::rule local_rule = optim::adam{1e-3f};  ///< the worker's optimiser (Hermans used Adam)
  bool staleness_aware = true;  ///< commits normalised by the window's steps (false: the raw residual)
  /// The local rule's rate at the global step the worker last saw (e.g. optim::cosine_decay);
  /// empty: the rule's own rate.
  std::function<float(std::int64_t global_step)> schedule{};
};

/// Accumulated Gradient Normalization (Hermans et al. 2017, dist-keras's ADAG): λ local steps,
/// then the worker commits the mean of its window's updates, which the ps adds, and pulls again.
/// A dtf::strategy of kind asynchronous.
class agn {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = agn_config;
  using state_type = worker_state;  ///< dtf::strategy: what a step sees
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::asynchronous;
  /// A strategy with the given knobs. Errors: errc::invalid_config when window is 0.
  explicit agn(config_type c = {}) : c_(std::move(c)) {
    if (c_.window == 0) throw error(errc::invalid_config, "agn: window must be positive");
  }

  /// dtf::strategy: the update rule the chief initialises the ps with.
  optim::rule ps_rule() const { return optim::sgd{}; }  // commits are deltas: the ps adds them
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
    return c_.staleness_aware ? "--lr (the rate of agn_config::local_rule): lower it, or lengthen --window"
                              : "--staleness_aware (agn_config::staleness_aware): turn it on, or lower --lr";
  }
  /// dtf::strategy: the job's end for this worker: flushes what is pending.
  void end(worker_state& w) {
    if (win_.count() > 0) commit(w);
  }

 private:
  void commit(worker_state& w) {
    // ÷ the steps taken: λ for a full window, fewer for the partial last one (end()).
    const float scale = c_.staleness_aware ? 1.0f / float(win_.count()) : 1.0f;
    w.pushed(w.ps.push_deltas(win_.residual(w, scale)));
    win_.repull(w);
  }

  config_type c_;
  detail::local_window win_;
};
static_assert(async_strategy<agn>);
static_assert(check_strategy<agn>(), "agn must model dtf::strategy: config_type, state_type, kind, ps_rule(), lock_free(), "
                                     "begin(w), step(w, f) -> float, end(w) (see dtf/concepts.hpp)");

}  // namespace dtf::strategies
