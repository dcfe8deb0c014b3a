// dtf/strategies/mirrored.hpp — R model replicas in one process (TensorFlow's
// MirroredStrategy), composed with the ring across processes: replicas × processes
// data-parallel replicas in all.
//
//   dtf::communicator comm = dtf::make_communicator(cluster, options);   // 1 process: size 1
//   dtf::strategies::mirrored<dtf::nn::sequential> s(comm, net, 4, {.rule = dtf::optim::adam{1e-3f}});
//   s.initialize(seed);
//   std::vector<dtf::data::host_batch> batches(4);   // one per replica
//   loss = s.step(batches);
//
// Each replica runs on its own thread (CPU builds; on CUDA builds replica k uses GPU
// k % device count) with its own copy of the model and of the variables. A step:
//   1. every replica computes gradients on its batch;
//   2. in shared memory, replica k averages slice k of every replica's gradients (R threads
//      reduce R slices in parallel), then waits for the others; or, in a CUDA build that links
//      dtf::nccl (DTF_HAVE_NCCL) when every replica has a GPU of its own (more than one
//      replica, at most as many as visible GPUs), NCCL averages them across the GPUs in place
//      (ncclCommInitAll over the replicas' devices once; ncclAllReduce with ncclAvg inside
//      ncclGroupStart/End per step), with no copy through host memory. Both compute the mean
//      of the replicas' gradients (and losses);
//   3. replica 0 averages the result across processes with the ring allreduce (skipped
//      with one process);
//   4. every replica applies the same optimiser step to its own variables, so the copies
//      stay bitwise identical.
// Every process must run the same number of replicas (the global mean is then the mean of
// the processes' means). Communication per step: one allreduce of the model's gradients per
// process, none between the replicas of a process (shared memory).
//
// NOT YET RUN on GPUs: the NCCL path compiles in dtf's CUDA build, but no GPU was available
// while it was written.
//
// Errors: a replica that throws breaks the step: the other replicas stop at their next
// synchronisation point and step() rethrows the first error; a replica stuck longer than
// timeout_ms is errc::timeout. Errors of the communicator as in dtf/collectives.hpp; a failed
// CUDA or NCCL call is errc::internal naming the call and its error string.
// Thread safety: one caller thread per instance; the replica threads live as long as it does.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/concepts.hpp>
#include <dtf/config.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/host.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/optim/schedule.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/runtime.hpp>
#include <dtf/tensor.hpp>

#include <thrust/copy.h>

#include <dtf/strategies/replicas.hpp>  // replica_barrier, replica_threads, nccl_replica_group

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace dtf::strategies {

struct mirrored_config {
  optim::rule rule = optim::adam{.learning_rate = 1e-3f};  ///< applied by every replica to the mean
  /// Multiply the rule's rate by the number of replicas in all (replicas × processes),
  /// reached linearly over warmup_steps.
  bool linear_scaling = false;
  std::int64_t warmup_steps = 0;
  std::uint32_t timeout_ms = 60000;  ///< longest a replica may wait for the others inside a step
};

/// Nccl: reduce the replicas with NCCL where every replica has a GPU of its own (see the file
/// comment); the default is whether this translation unit can (DTF_HAVE_NCCL in a CUDA build).
template <class M = void, bool Nccl = bool(DTF_MIRRORED_NCCL)>
class mirrored;

/// The strategy value dtf::train takes (dtf::strategy, kind collective):
///   dtf::train(cluster, net, data, dtf::strategies::mirrored<>({.rule = ...}, 4), options)
/// It holds the config and the replicas per process; train builds the engine mirrored<M>
/// (below) in every process.
template <bool Nccl>
class mirrored<void, Nccl> {
 public:
  using config_type = mirrored_config;
  static constexpr strategy_kind kind = strategy_kind::collective;
  template <model M>
  using engine = mirrored<M, Nccl>;

  explicit mirrored(config_type c = {}, std::size_t replicas = 2) : config(c), replicas(replicas) {}
  std::size_t replicas_per_process() const noexcept { return replicas; }
  template <model M>
  engine<M> make(communicator& comm, const M& prototype) const {
    return engine<M>(comm, prototype, replicas, config);
  }

  config_type config;
  std::size_t replicas;
};
static_assert(check_strategy<mirrored<>>(),
              "mirrored<> must model dtf::strategy: config_type, kind, replicas_per_process(), engine<M>");

/// The engine: this process's replicas.
template <model M, bool Nccl>
class mirrored<M, Nccl> {
  static_assert(!Nccl || DTF_MIRRORED_NCCL,
                "mirrored<M, true> reduces with NCCL: compile with -DDTF_CUDA=ON and link the dtf::nccl target");

 public:
  /// `replicas` copies of `prototype`, one per thread. Errors: errc::invalid_argument for 0
  /// replicas; with NCCL, errc::internal when its initialisation fails.
  mirrored(communicator& comm, const M& prototype, std::size_t replicas, mirrored_config config = {})
      : comm_(comm), config_(config), n_(num_parameters(prototype.variables())), reduced_(n_ + 1) {
    if (replicas == 0) throw error(errc::invalid_argument, "mirrored: 0 replicas");
    for (std::size_t k = 0; k < replicas; ++k) {
      on_device(k);
      replicas_.push_back(std::make_unique<replica>(prototype, n_, config_.rule));
    }
#if DTF_CUDA
    if constexpr (Nccl) {
      int count = 0;
      if (replicas > 1 && cudaGetDeviceCount(&count) == cudaSuccess && std::size_t(count) >= replicas) {
        std::vector<int> devices(replicas);
        for (std::size_t k = 0; k < replicas; ++k) devices[k] = int(k);  // on_device(k): GPU k here
        nccl_ = std::make_unique<detail::nccl_replica_group>(std::move(devices));
      }
    }
#endif
    on_device(0);
    threads_ = std::make_unique<detail::replica_threads>(replicas, [](std::size_t k) {
      set_cpu_threads({.device = 1, .blas = 0});  // OpenMP's thread count is per thread
      on_device(k);
    });
  }

  std::size_t replicas() const noexcept { return replicas_.size(); }
  /// Whether the replicas are reduced by NCCL across GPUs (otherwise in host memory).
  bool reduces_on_gpus() const noexcept {
    if constexpr (Nccl)
      return nccl_ != nullptr;
    else
      return false;
  }
  /// Replicas in all: replicas() × processes.
  std::size_t global_replicas() const noexcept { return replicas_.size() * comm_.size(); }

  /// Rank 0's replica 0 initialises the variables from `seed`; every replica of every process
  /// receives them.
  void initialize(std::uint64_t seed) {
    replica& first = *replicas_[0];
    if (comm_.rank() == 0) first.net.initialize(first.params.template span<float>(), seed);
    comm_.broadcast("mirrored/params", first.params, 0);
    std::vector<float> host = first.params.template to_vector<float>();
    for (std::size_t k = 1; k < replicas_.size(); ++k) {
      on_device(k);
      replicas_[k]->params.template copy_from_host<float>(host);
    }
    on_device(0);
  }

  /// One synchronous step: batches[k] is replica k's batch. Returns the loss averaged over
  /// every replica of every process.
  float step(std::span<const data::host_batch> batches) {
    const std::size_t r = replicas_.size();
    if (batches.size() != r)
      throw error(errc::invalid_argument,
                  "mirrored::step: " + std::to_string(batches.size()) + " batches for " + std::to_string(r) + " replicas");
    detail::replica_barrier barrier(r);
    std::vector<std::exception_ptr> failures(r);
    const float lr = learning_rate();
    const auto body = [&](std::size_t k) {
      try {
        replica_step(k, batches[k], barrier, lr);
      } catch (...) {
        failures[k] = std::current_exception();
        barrier.break_barrier();
      }
    };
    threads_->run(body);
    // The root cause first: a replica's own failure, not another's "a replica failed".
    for (auto& f : failures)
      if (f) {
        try {
          std::rethrow_exception(f);
        } catch (const error& e) {
          if (e.code() == make_error_code(errc::peer_failure) && e.message() == "mirrored: another replica failed")
            continue;
          throw;
        }
      }
    for (auto& f : failures)
      if (f) std::rethrow_exception(f);
    ++step_;
    return reduced_[n_];
  }

  /// The rate of the next step.
  float learning_rate() const {
    const float base = optim::detail::base_learning_rate(config_.rule);
    if (!config_.linear_scaling) return base;
    return optim::linear_scaling_warmup{.base_rate = base, .scale = float(global_replicas()),
                                        .warmup_steps = std::max<std::int64_t>(0, config_.warmup_steps)}(step_);
  }

  /// Replica k's variables (every replica holds the same values).
  std::span<const float> parameters(std::size_t k = 0) const { return replicas_.at(k)->params.template span<const float>(); }
  M& model(std::size_t k = 0) { return replicas_.at(k)->net; }
  std::int64_t global_step() const noexcept { return step_; }

  /// Replica k's update-rule state, for checkpoints (every replica holds the same).
  const optim::optimizer<>& optimizer(std::size_t k = 0) const { return replicas_.at(k)->opt; }
  /// Restores a saved state into every replica of this process: the parameters, the rule's
  /// slots and update count (host buffers) and the global step (which drives the warm-up).
  /// Every process must restore the same state. Errors: errc::shape_mismatch.
  void restore(std::span<const float> values, std::span<const std::vector<float>> slots, std::int64_t iterations,
               std::int64_t global_step) {
    for (std::size_t k = 0; k < replicas_.size(); ++k) {
      on_device(k);
      replicas_[k]->params.template copy_from_host<float>(values);
      replicas_[k]->opt.load_host_slots(slots, iterations);
    }
    on_device(0);
    step_ = global_step;
  }

 private:
  struct replica {
    replica(const M& prototype, std::size_t n, const optim::rule& rule)
        : net(prototype), params({n}), grads({n + 1}), host_grads(device_memory_is_host_accessible ? 0 : n + 1),
          opt(rule, n) {}
    M net;
    tensor params, grads, x, y;
    std::vector<float> host_grads;  // CUDA builds: the gradients staged in host memory
    optim::optimizer<> opt;
  };

  static void on_device([[maybe_unused]] std::size_t k) {
#if DTF_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) cudaSetDevice(int(k % std::size_t(count)));
#endif
  }

  // Replica k's gradients as host memory.
  const float* host_gradients(std::size_t k) {
    replica& rep = *replicas_[k];
    if constexpr (device_memory_is_host_accessible) return rep.grads.template data<float>();
    return rep.host_grads.data();
  }

  void replica_step(std::size_t k, const data::host_batch& b, detail::replica_barrier& barrier, float lr) {
    const auto timeout = std::chrono::milliseconds(config_.timeout_ms);
    replica& rep = *replicas_[k];
    assign_from_host(rep.x, b.features);
    assign_from_host(rep.y, b.labels);
    const float loss = rep.net.loss_and_gradients(rep.params.template span<const float>(), rep.x, rep.y,
                                                  rep.grads.template span<float>().first(n_));
#if DTF_CUDA
    if constexpr (Nccl)
      if (nccl_) return nccl_step(k, loss, barrier, lr);
#endif
    if constexpr (device_memory_is_host_accessible) {
      rep.grads.template data<float>()[n_] = loss;
    } else {
      auto g = rep.grads.template device_ptr<float>();
      thrust::copy(g, g + std::ptrdiff_t(n_), rep.host_grads.begin());
      rep.host_grads[n_] = loss;
    }
    barrier.arrive_and_wait(timeout);
    // Replica k averages slice k of everyone's gradients (and the loss) into reduced_.
    const std::size_t r = replicas_.size(), total = n_ + 1;
    const std::size_t begin = total * k / r, end = total * (k + 1) / r;
    const float inv = 1.0f / float(r);
    float* out = reduced_.data();
    const float* first = host_gradients(0);
    for (std::size_t i = begin; i < end; ++i) out[i] = first[i];
    for (std::size_t j = 1; j < r; ++j) {
      const float* g = host_gradients(j);
      for (std::size_t i = begin; i < end; ++i) out[i] += g[i];
    }
    for (std::size_t i = begin; i < end; ++i) out[i] *= inv;
    barrier.arrive_and_wait(timeout);
    if (k == 0 && comm_.size() > 1) comm_.allreduce<float>("mirrored/gradients", std::span<float>(reduced_), reduce_op::average);
    barrier.arrive_and_wait(timeout);
    if constexpr (device_memory_is_host_accessible) {
      rep.opt.apply(rep.params.template span<float>(), std::span<const float>(reduced_).first(n_), lr);
    } else {
      auto g = rep.grads.template device_ptr<float>();
      thrust::copy(reduced_.begin(), reduced_.begin() + std::ptrdiff_t(n_), g);
      rep.opt.apply(rep.params.template span<float>(), rep.grads.template span<const float>().first(n_), lr);
    }
  }

#if DTF_CUDA
  // Steps 2–4 with NCCL: the replicas' gradients (the loss in slot n) averaged in place on their
  // GPUs; replica 0 then averages across processes through host memory, as the host path does.
  void nccl_step(std::size_t k, float loss, detail::replica_barrier& barrier, float lr) {
    const auto timeout = std::chrono::milliseconds(config_.timeout_ms);
    replica& rep = *replicas_[k];
    float* grads = rep.grads.template data<float>();
    dtf::detail::check_cuda(cudaMemcpy(grads + n_, &loss, sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy (loss)");
    // The model's kernels ran on the default stream; NCCL's streams do not wait for it.
    dtf::detail::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (gradients)");
    barrier.arrive_and_wait(timeout);
    if (k == 0) {
      std::vector<float*> buffers;
      for (auto& r : replicas_) buffers.push_back(r->grads.template data<float>());
      nccl_->average(buffers, n_ + 1);
      on_device(0);
      const bool across = comm_.size() > 1;
      dtf::detail::check_cuda(cudaMemcpy(across ? reduced_.data() : reduced_.data() + n_, across ? grads : grads + n_,
                                         (across ? n_ + 1 : 1) * sizeof(float), cudaMemcpyDeviceToHost),
                              "cudaMemcpy (reduced gradients)");
      if (across) comm_.allreduce<float>("mirrored/gradients", std::span<float>(reduced_), reduce_op::average);
    }
    barrier.arrive_and_wait(timeout);
    if (comm_.size() > 1)
      dtf::detail::check_cuda(cudaMemcpy(grads, reduced_.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
                              "cudaMemcpy (gradients across processes)");
    rep.opt.apply(rep.params.template span<float>(), rep.grads.template span<const float>().first(n_), lr);
  }
#endif

  communicator& comm_;
  mirrored_config config_;
  std::size_t n_;
  std::vector<float> reduced_;
  std::vector<std::unique_ptr<replica>> replicas_;
  std::int64_t step_ = 0;
  // Null (or nothing, without NCCL): the host path. Its type depends on Nccl only, never on
  // the translation unit, so that mirrored<M, false> has one layout everywhere.
  std::conditional_t<Nccl, std::unique_ptr<detail::nccl_replica_group>, detail::no_replica_group> nccl_;
  std::unique_ptr<detail::replica_threads> threads_;  // last: its threads stop before the replicas go
};

}  // namespace dtf::strategies
