// dtf/strategies/downpour.hpp — DOWNPOUR SGD (Dean et al. 2012, "Large Scale Distributed Deep
// Networks") and the TensorFlow guide's DOWNPOUR-Easy.
//
// Every fetch_every steps the worker pulls θ̃. Every step it computes g, adds it to an
// accumulator and takes a local step with its local optimiser. Every push_every steps it
// pushes the accumulated gradient, which the ps applies with its own optimiser (Adagrad by
// default, per coordinate, as in the paper), and resets the accumulator.
// DOWNPOUR-Easy: plain local SGD whose rate differs per worker (local_rates[k] for worker k).
// Staleness-aware (the default, Zhang et al. 2016): the ps applies each push at its rule's rate
// / (τ + 1), τ being the updates it applied since this worker's pull (measured at the push).
// Communication per window: one pull every fetch_every steps, one push every push_every.
#pragma once

#include <dtf/strategies/async.hpp>

#include <cstdint>
#include <functional>
#include <optional>

namespace dtf::strategies {

/// downpour's knobs.
struct downpour_config {
  std::size_t fetch_every = 5;                     ///< steps between pulls (dist-keras: 5)
  std::size_t push_every = 5;                      ///< steps between pushes (dist-keras: 5)
  optim::rule local_rule = optim::sgd{0.01f};      ///< the worker's own steps between pulls
  optim::rule ps_rule = optim::adagrad{0.05f};     ///< what the ps applies to the pushes
  std::vector<float> local_rates{};                ///< DOWNPOUR-Easy: worker k uses local SGD
                                                   ///< at local_rates[k % size()] when non-empty
  bool staleness_aware = true;  ///< the ps divides each push's rate by its staleness + 1
  /// The rate the ps applies ps_rule at for each push, from the global step the worker last saw
  /// (e.g. optim::cosine_decay); empty: ps_rule's own rate.
  std::function<float(std::int64_t global_step)> schedule{};
};

/// DOWNPOUR-Easy's configuration: local SGD at per-worker rates, Adagrad on the ps.
inline downpour_config downpour_easy_config(std::vector<float> local_rates, float ps_rate = 0.05f) {
  downpour_config c;
  c.local_rule = optim::sgd{local_rates.empty() ? 0.01f : local_rates.front()};
  c.local_rates = std::move(local_rates);
  c.ps_rule = optim::adagrad{ps_rate};
  return c;
}

/// DOWNPOUR SGD (Dean et al. 2012) and DOWNPOUR-Easy: pulls every fetch_every steps, local steps
/// with its own optimiser, pushes the accumulated gradient every push_every steps (the ps applies
/// it with ps_rule). A dtf::strategy of kind asynchronous.
class downpour {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = downpour_config;
  using state_type = worker_state;  ///< dtf::strategy: what a step sees
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::asynchronous;
  /// A strategy with the given knobs. Errors: errc::invalid_config when fetch_every or push_every
  /// is 0.
  explicit downpour(config_type c = {}) : c_(std::move(c)) {
    if (c_.fetch_every == 0 || c_.push_every == 0)
      throw error(errc::invalid_config, "downpour: fetch_every and push_every must be positive");
  }

  /// dtf::strategy: the update rule the chief initialises the ps with.
  optim::rule ps_rule() const { return c_.ps_rule; }
  /// dtf::strategy (asynchronous): whether the ps applies updates without locks.
  bool lock_free() const { return false; }

  /// dtf::strategy: after the ps is ready, and after a recovery: (re)starts this worker's scheme.
  void begin(worker_state& w) {
    const optim::rule local =
        c_.local_rates.empty() ? c_.local_rule : optim::sgd{c_.local_rates[w.worker_index % c_.local_rates.size()]};
    local_ = std::make_unique<detail::host_optimizer>(local, w.params.size());
    acc_.assign(w.params.size(), 0.0f);
    pending_ = 0;
    pull_next_ = true;  // at the start and after a recovery (which calls begin()): θ̃ afresh
  }

  /// dtf::strategy: one local step: the gradient through `grad`, the pulls and pushes the scheme
  /// makes; returns the batch's loss.
  float step(worker_state& w, const gradient_fn& grad) {
    if (pull_next_ || w.local_step % std::int64_t(c_.fetch_every) == 0) {
      w.ps.pull(w.params);
      pull_next_ = false;
    }
    const float loss = grad(w.params, w.grads);
    for (std::size_t i = 0; i < acc_.size(); ++i) acc_[i] += w.grads[i];
    detail::local_step(*local_, w.params, w.grads);
    if (++pending_ == c_.push_every) flush(w);
    return loss;
  }

  /// The setting to change when the update is unstable at the measured staleness
  /// (dtf/strategies/staleness_watch.hpp).
  const char* stability_setting() const noexcept {
    return c_.staleness_aware ? "--ps_lr (the rate of downpour_config::ps_rule): lower it, or push more often (--push_every)"
                              : "--staleness_aware (downpour_config::staleness_aware): turn it on, or lower --ps_lr";
  }
  /// dtf::strategy: the job's end for this worker: flushes what is pending.
  void end(worker_state& w) {
    if (pending_ > 0) flush(w);
  }

  /// The local rate this worker uses (DOWNPOUR-Easy's per-worker rate when set).
  const config_type& config() const noexcept { return c_; }

 private:
  void flush(worker_state& w) {
    const std::optional<float> rate = c_.schedule ? std::optional<float>(c_.schedule(w.global_step)) : std::nullopt;
    w.pushed(w.ps.push_gradients(acc_, rate, true, c_.staleness_aware));
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    pending_ = 0;
  }

  config_type c_;
  std::unique_ptr<detail::host_optimizer> local_;
  std::vector<float> acc_;
  std::size_t pending_ = 0;
  bool pull_next_ = true;
};
static_assert(async_strategy<downpour>);
static_assert(check_strategy<downpour>(), "downpour must model dtf::strategy: config_type, state_type, kind, ps_rule(), lock_free(), "
                                     "begin(w), step(w, f) -> float, end(w) (see dtf/concepts.hpp)");

}  // namespace dtf::strategies
