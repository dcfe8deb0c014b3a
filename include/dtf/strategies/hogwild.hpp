// dtf/strategies/hogwild.hpp — Hogwild (Niu, Recht, Ré, Wright 2011): lock-free SGD.
//
// Through parameter servers: every step a worker pulls θ̃, computes a minibatch gradient g and
// pushes it; the ps applies θ̃ −= η g without locks (updates from concurrent pushes race, as
// in the paper). The step size shrinks by `epoch_decay` each epoch (the paper's β < 1).
// Staleness-aware (the default, Zhang et al. 2016): the ps applies each push at η / (τ + 1),
// τ being the updates it applied since this worker's pull (measured by the ps at the push).
// In one process: hogwild_threads() runs several threads that update one shared parameter
// buffer without locks.
// Communication per step: one pull and one push of the whole model.
#pragma once

#include <dtf/strategies/async.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>

namespace dtf::strategies {

/// hogwild's knobs.
struct hogwild_config {
  float learning_rate = 0.05f;  ///< η of the plain SGD the ps applies
  float epoch_decay = 0.9f;     ///< η is multiplied by this once per epoch (1: constant)
  /// Whether the ps divides the rate of each push by its staleness + 1 (staleness-aware SGD).
  /// Off by default: a Hogwild push is only a few updates stale (a pull and a push around every
  /// gradient), and the rule cost it accuracy at 4 and 16 workers (docs/benchmarks.md).
  bool staleness_aware = false;
  /// The rate of each push from the global step the worker last saw (e.g. optim::cosine_decay);
  /// empty: learning_rate times epoch_decay per epoch. The ps applies it (divided by the
  /// staleness + 1 when staleness_aware).
  std::function<float(std::int64_t global_step)> schedule{};
};

/// Hogwild (Niu et al. 2011) through parameter servers: every step the worker pulls θ̃ and pushes
/// a minibatch gradient, which the ps applies without locks; the rate shrinks by epoch_decay each
/// epoch. A dtf::strategy of kind asynchronous.
class hogwild {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = hogwild_config;
  using state_type = worker_state;  ///< dtf::strategy: what a step sees
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::asynchronous;
  /// A strategy with the given knobs.
  explicit hogwild(config_type c = {}) : c_(std::move(c)) {}

  /// dtf::strategy: the update rule the chief initialises the ps with.
  optim::rule ps_rule() const { return optim::sgd{c_.learning_rate}; }
  /// dtf::strategy (asynchronous): whether the ps applies updates without locks.
  bool lock_free() const { return true; }
  /// dtf::strategy: after the ps is ready, and after a recovery: (re)starts this worker's scheme.
  void begin(worker_state&) {}
  /// dtf::strategy: one local step: the gradient through `grad`, the pulls and pushes the scheme
  /// makes; returns the batch's loss.
  float step(worker_state& w, const gradient_fn& grad) {
    w.ps.pull(w.params);
    const float loss = grad(w.params, w.grads);
    const float lr = c_.schedule ? c_.schedule(w.global_step) : c_.learning_rate * std::pow(c_.epoch_decay, float(w.epoch));
    w.pushed(w.ps.push_gradients(w.grads, lr, true, c_.staleness_aware));
    return loss;
  }
  /// The setting to change when the update is unstable at the measured staleness
  /// (dtf/strategies/staleness_watch.hpp).
  const char* stability_setting() const noexcept {
    return c_.staleness_aware ? "--lr (hogwild_config::learning_rate): lower it"
                              : "--staleness_aware (hogwild_config::staleness_aware): turn it on, or lower --lr";
  }
  /// dtf::strategy: the job's end for this worker: flushes what is pending.
  void end(worker_state&) {}

 private:
  config_type c_;
};
static_assert(async_strategy<hogwild>);
static_assert(check_strategy<hogwild>(), "hogwild must model dtf::strategy: config_type, state_type, kind, ps_rule(), lock_free(), "
                                     "begin(w), step(w, f) -> float, end(w) (see dtf/concepts.hpp)");

/// Result of hogwild_threads.
struct hogwild_threads_report {
  std::size_t steps = 0;  ///< over all threads
  /// The loss of the last step.
  double last_loss = 0.0;
};

/// Hogwild in one process, as in the original paper: threads.size() == replicas.size()
/// threads, thread k training replicas[k] on its stream of batches streams[k] (e.g. shards
/// of one dataset), each reading the shared parameters and writing θ −= η g back to them
/// element by element without locks (relaxed atomic reads, and a relaxed atomic fetch_sub per
/// element: a thread may compute on values that others change meanwhile, which is Hogwild's
/// bargain, but no update is lost and no access is a data race).
/// CPU builds only (the shared buffer is host memory that the model reads).
template <model M>
hogwild_threads_report hogwild_threads(std::vector<M>& replicas, std::span<float> shared,
                                       std::vector<data::batch_stream*> streams, float learning_rate) {
  static_assert(device_memory_is_host_accessible && sizeof(M) > 0,
                "hogwild_threads needs host-accessible device memory (a CPU build)");
  if (streams.size() != replicas.size())
    throw error(errc::invalid_argument, "hogwild_threads: " + std::to_string(streams.size()) + " streams for " +
                                            std::to_string(replicas.size()) + " replicas");
  std::atomic<std::size_t> steps{0};
  std::vector<double> last(replicas.size(), 0.0);
  std::vector<std::exception_ptr> failures(replicas.size());
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < replicas.size(); ++k)
    threads.emplace_back([&, k] {
      try {
        const std::size_t n = shared.size();
        std::vector<float> local(n), g(n);
        tensor x, y;
        while (auto b = streams[k]->next()) {
          for (std::size_t i = 0; i < n; ++i) local[i] = std::atomic_ref<float>(shared[i]).load(std::memory_order_relaxed);
          assign_from_host(x, b->features);
          assign_from_host(y, b->labels);
          last[k] = replicas[k].loss_and_gradients(local, x, y, g);
          // One atomic read-modify-write per element: concurrent updates interleave, none is lost.
          for (std::size_t i = 0; i < n; ++i)
            std::atomic_ref<float>(shared[i]).fetch_sub(learning_rate * g[i], std::memory_order_relaxed);
          ++steps;
        }
      } catch (...) {
        failures[k] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
  hogwild_threads_report r;
  r.steps = steps.load();
  for (double l : last) r.last_loss += l / double(last.size());
  return r;
}

}  // namespace dtf::strategies
