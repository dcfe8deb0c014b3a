// dtf/strategies/window.hpp — the local-window bookkeeping that AGN and DynSGD share: pull θ̃
// into θₖ, take local optimiser steps, form the residual θₖ − θ_pulled, push, pull again.
#pragma once

#include <dtf/strategies/async.hpp>

#include <optional>

namespace dtf::strategies::detail {

class local_window {
 public:
  void begin(worker_state& w, const optim::rule& local_rule) {
    local_ = std::make_unique<host_optimizer>(local_rule, w.params.size());
    delta_.assign(w.params.size(), 0.0f);
    pulled_.assign(w.params.size(), 0.0f);
    repull(w);
  }

  /// One local step on the current batch (at rate lr when given, the local rule's otherwise);
  /// returns its loss.
  float step(worker_state& w, const gradient_fn& grad, std::optional<float> lr = std::nullopt) {
    const float loss = grad(w.params, w.grads);
    local_step(*local_, w.params, w.grads, lr);
    ++count_;
    return loss;
  }

  std::size_t count() const noexcept { return count_; }

  /// (θₖ − θ_pulled) * scale.
  std::span<const float> residual(const worker_state& w, float scale) {
    for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = (w.params[i] - pulled_[i]) * scale;
    return delta_;
  }

  /// θₖ = θ_pulled = θ̃, and a new window.
  void repull(worker_state& w) {
    w.ps.pull(w.params);
    std::copy(w.params.begin(), w.params.end(), pulled_.begin());
    count_ = 0;
  }

 private:
  std::unique_ptr<host_optimizer> local_;
  std::vector<float> pulled_, delta_;
  std::size_t count_ = 0;
};

}  // namespace dtf::strategies::detail
