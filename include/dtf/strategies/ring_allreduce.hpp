// dtf/strategies/ring_allreduce.hpp — synchronous data-parallel training without parameter
// servers (Horovod's scheme): every rank holds the whole model, computes gradients on its
// shard of the batch, the gradients are averaged with a ring allreduce, and every rank applies
// the same optimiser step, so the replicas stay bitwise identical.
//
//   dtf::communicator comm = dtf::make_communicator(cluster, options);
//   dtf::strategies::ring_allreduce<dtf::nn::sequential> s(comm, net, {.rule = dtf::optim::adam{1e-3f}});
//   s.initialize(seed);                 // rank 0 initialises, everyone receives its values
//   for (...) loss = s.step(batch);     // the loss averaged over every rank's shard
//
// With plain SGD, n ranks at batch B compute exactly the update one process computes at batch
// n·B (the mean of equal-size means is the mean), up to float rounding.
//
// Communication per step: one allreduce of the model's gradients plus one float (the loss
// travels in the same buffer): 2(n-1)/n of the model's bytes sent and received per rank.
// Errors: those of dtf::communicator (a dead or mismatched rank fails every rank).
// Thread safety: one thread per instance.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/concepts.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/error.hpp>
#include <dtf/host.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/optim/schedule.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/tensor.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dtf::strategies {

struct ring_allreduce_config {
  optim::rule rule = optim::adam{.learning_rate = 1e-3f};  ///< applied by every rank to the average
  /// Multiply the rule's rate by the number of ranks (Goyal et al. 2017), reached linearly
  /// over warmup_steps; off: the rule's rate as given.
  bool linear_scaling = false;
  std::int64_t warmup_steps = 0;
};

template <class M = void>
class ring_allreduce;

/// The strategy value dtf::train takes (dtf::strategy, kind collective):
///   dtf::train(cluster, net, data, dtf::strategies::ring_allreduce<>({.rule = ...}), options)
/// It holds the config; train builds the engine ring_allreduce<M> (below) on every rank.
template <>
class ring_allreduce<void> {
 public:
  using config_type = ring_allreduce_config;
  static constexpr strategy_kind kind = strategy_kind::collective;
  template <model M>
  using engine = ring_allreduce<M>;

  ring_allreduce() = default;
  explicit ring_allreduce(config_type c) : config(c) {}
  /// One batch per process and step.
  std::size_t replicas_per_process() const noexcept { return 1; }
  template <model M>
  engine<M> make(communicator& comm, M& net) const {
    return engine<M>(comm, net, config);
  }

  config_type config;
};
static_assert(check_strategy<ring_allreduce<>>(),
              "ring_allreduce<> must model dtf::strategy: config_type, kind, replicas_per_process(), engine<M>");

/// The engine: one rank's replica of the model and its optimiser.
template <model M>
class ring_allreduce<M> {
 public:
  ring_allreduce(communicator& comm, M& net, ring_allreduce_config config = {})
      : comm_(comm), net_(net), config_(config), n_(num_parameters(net.variables())), params_({n_}),
        grads_({n_ + 1}), optimizer_(config.rule, n_) {}

  /// Rank 0 initialises the parameters from `seed`; every rank receives them.
  void initialize(std::uint64_t seed) {
    if (comm_.rank() == 0) net_.initialize(params_.template span<float>(), seed);
    comm_.broadcast("ring_allreduce/params", params_, 0);
  }

  /// One synchronous step on this rank's batch: gradients, allreduce (average), update.
  /// Returns the loss averaged over the ranks' batches.
  float step(const data::host_batch& b) {
    assign_from_host(x_, b.features);
    assign_from_host(y_, b.labels);
    const float loss =
        net_.loss_and_gradients(params_.template span<const float>(), x_, y_, grads_.template span<float>().first(n_));
    auto g = grads_.template device_ptr<float>();
    thrust::fill(g + std::ptrdiff_t(n_), g + std::ptrdiff_t(n_ + 1), loss);
    comm_.allreduce("ring_allreduce/gradients", grads_, reduce_op::average);
    optimizer_.apply(params_.template span<float>(), grads_.template span<const float>().first(n_), learning_rate());
    ++step_;
    float mean_loss = 0;
    thrust::copy(g + std::ptrdiff_t(n_), g + std::ptrdiff_t(n_ + 1), &mean_loss);
    return mean_loss;
  }

  /// dtf::train's form: this rank's one batch (errc::invalid_argument for any other count).
  float step(std::span<const data::host_batch> batches) {
    if (batches.size() != 1)
      throw error(errc::invalid_argument, "ring_allreduce: one batch per step, got " + std::to_string(batches.size()));
    return step(batches.front());
  }

  /// The rate of the next step.
  float learning_rate() const {
    const float base = optim::detail::base_learning_rate(config_.rule);
    if (!config_.linear_scaling) return base;
    return optim::linear_scaling_warmup{.base_rate = base, .scale = float(comm_.size()),
                                        .warmup_steps = std::max<std::int64_t>(0, config_.warmup_steps)}(step_);
  }

  std::span<const float> parameters() const { return params_.template span<const float>(); }
  std::span<float> parameters() { return params_.template span<float>(); }
  std::int64_t global_step() const noexcept { return step_; }
  communicator& comm() noexcept { return comm_; }

  /// The update rule's state, for checkpoints (every rank holds the same).
  const optim::optimizer<>& optimizer() const noexcept { return optimizer_; }
  /// Restores a saved state on this rank: the parameters, the rule's slots and update count
  /// (host buffers) and the global step (which drives the warm-up). Every rank must restore the
  /// same state (e.g. rank 0 reads a checkpoint and broadcasts it). Errors: errc::shape_mismatch.
  void restore(std::span<const float> values, std::span<const std::vector<float>> slots, std::int64_t iterations,
               std::int64_t global_step) {
    params_.template copy_from_host<float>(values);
    optimizer_.load_host_slots(slots, iterations);
    step_ = global_step;
  }

 private:
  communicator& comm_;
  M& net_;
  ring_allreduce_config config_;
  std::size_t n_;
  tensor params_, grads_, x_, y_;
  optim::optimizer<> optimizer_;
  std::int64_t step_ = 0;
};

}  // namespace dtf::strategies
