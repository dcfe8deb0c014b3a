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
//      ncclGroupStart/End per step). Both compute the mean of the replicas' gradients (and losses);
//   3. replica 0 averages the result across processes with the ring allreduce (skipped
//      with one process), in buckets cut at variable boundaries (config.bucket_bytes, see
//      dtf/strategies/gradient_buckets.hpp), one allreduce each, always in the same order
//      (with NCCL: each bucket through a pinned buffer, then ncclBroadcast to the replicas);
//   4. every replica applies the same optimiser step to its own variables, so the copies
//      stay bitwise identical.
// Overlap (config.overlap, CPU builds, more than one process, a model that streams its
// gradients, dtf::streams_gradients): steps 2 and 3 run bucket by bucket on a communication
// thread as soon as every replica has produced a bucket's gradients, while the replicas'
// backprop goes on below it. The buckets, their order and the arithmetic are the same with
// overlap off, so the variables are bitwise identical either way.
// The training loop's extras (config, as ring_allreduce's): `schedule`; `clip_norm`, applied to
// the mean across every replica of every process, so the copies stay equal;
// `backward_passes_per_step`, each replica's batch in micro-batches (no overlap then).
// Every process must run the same number of replicas (the global mean is then the mean of
// the processes' means). Communication per step: one allreduce of the model's gradients per
// process, none between the replicas of a process (shared memory).
//
// Each replica has its own device::context, created on its device and bound to its model when
// the model takes one (dtf/strategies/mirrored_replicas.hpp; docs/design/gpu-execution.md,
// section 2.1): the model's step, the loss's slot, the clip and the update on the replica's
// compute stream; with NCCL, the replicas' reduction on their communication streams, ordered by
// events. CPU builds: the context's CPU twin, the same arithmetic. NOT YET RUN on GPUs: the
// CUDA paths compile in dtf's CUDA build, but no GPU was available while they were written.
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
#include <dtf/optim/clip.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/optim/schedule.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/runtime.hpp>
#include <dtf/strategies/gradient_buckets.hpp>
#include <dtf/strategies/micro_batches.hpp>
#include <dtf/tensor.hpp>

#include <dtf/strategies/mirrored_replicas.hpp>  // mirrored_replica: a replica and its context
#include <dtf/strategies/mirrored_staging.hpp>   // pinned_floats, replica_staging
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

/// mirrored's knobs.
struct mirrored_config {
  optim::rule rule = optim::adam{.learning_rate = 1e-3f};  ///< applied by every replica to the mean
  /// Multiply the rule's rate by the number of replicas in all (replicas × processes),
  /// reached linearly over warmup_steps.
  bool linear_scaling = false;
  /// Steps over which the scaled rate is reached (linear_scaling).
  std::int64_t warmup_steps = 0;
  std::uint32_t timeout_ms = 60000;  ///< longest a replica may wait for the others inside a step
  /// Reduce each bucket of gradients (across the replicas, then the processes) on a
  /// communication thread as soon as every replica has produced it (see the file comment).
  bool overlap = true;
  /// Gradients cross processes in buckets of at least this many bytes, cut at variable
  /// boundaries (0: one bucket). Every process must use the same value.
  std::size_t bucket_bytes = std::size_t(4) << 20;
  /// The learning rate at each global step (see ring_allreduce_config::schedule); empty: the
  /// rule's rate (with linear_scaling). Not with linear_scaling.
  std::function<float(std::int64_t global_step)> schedule{};
  /// Clip the mean gradient to this global L2 norm before the update (torch.nn.utils.
  /// clip_grad_norm_); 0: no clipping.
  float clip_norm = 0.0f;
  /// Backward passes per step: each replica's batch runs as this many accumulated micro-batches
  /// (dtf/strategies/micro_batches.hpp); 1: one pass.
  int backward_passes_per_step = 1;
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
  /// dtf::strategy: the strategy's knobs.
  using config_type = mirrored_config;
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::collective;
  /// dtf::strategy (collective): the per-task engine for a model M.
  template <model M>
  using engine = mirrored<M, Nccl>;

  /// A strategy with the given knobs and `replicas` model replicas in each process.
  explicit mirrored(config_type c = {}, std::size_t replicas = 2) : config(c), replicas(replicas) {}
  /// dtf::strategy (collective): the batches each process trains per step.
  std::size_t replicas_per_process() const noexcept { return replicas; }
  /// dtf::strategy (collective): builds this task's engine over `comm` for the model.
  template <model M>
  engine<M> make(communicator& comm, const M& prototype) const {
    return engine<M>(comm, prototype, replicas, config);
  }

  /// The knobs every engine gets.
  config_type config;
  /// Model replicas per process.
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
      : comm_(comm), config_(config), n_(num_parameters(prototype.variables())), reduced_(pre + n_) {
    detail::check_loop_config(config_, "mirrored");
    if (replicas == 0) throw error(errc::invalid_argument, "mirrored: 0 replicas");
#if DTF_MIRRORED_NCCL
    if constexpr (Nccl) nccl_ = detail::make_nccl_replica_group(replicas);  // on_device(k): GPU k there
#endif
    for (std::size_t k = 0; k < replicas; ++k) {
      on_device(k);
      replicas_.push_back(std::make_unique<replica>(prototype, n_, config_.rule, config_.backward_passes_per_step,
                                                    !reduces_on_gpus()));
    }
#if DTF_MIRRORED_NCCL
    if constexpr (Nccl)
      if (nccl_) {  // the group's buffers and streams, once; replica 0's staging across processes
        detail::bind_replicas(*nccl_, replicas_);
        staging_ = std::make_unique<detail::replica_staging>(pre + n_);
      }
#endif
    on_device(0);
    reducer_ = std::make_unique<detail::bucket_reducer>(
        detail::plan_buckets(prototype.variables(), pre, config.bucket_bytes),
        config.overlap && streams_gradients<M> && device_memory_is_host_accessible && comm.size() > 1 &&
            !reduces_on_gpus() && config.backward_passes_per_step == 1,
        replicas);
    threads_ = std::make_unique<detail::replica_threads>(replicas, [](std::size_t k) {
      set_cpu_threads({.device = 1, .blas = 0});  // OpenMP's thread count is per thread
      on_device(k);
    });
  }

  /// The number of replicas in this process.
  std::size_t replicas() const noexcept { return replicas_.size(); }
  /// Whether the replicas are reduced by NCCL across GPUs (otherwise in host memory).
  bool reduces_on_gpus() const noexcept {
    if constexpr (Nccl)
      return nccl_ != nullptr;
    else
      return false;
  }
  /// Whether the buckets are reduced while the replicas' backprop runs (see the file comment).
  bool overlaps() const noexcept { return reducer_->overlapping(); }
  /// The buckets the gradients cross processes in ([begin, end) floats of [loss, 15 zeros,
  /// gradient]), in the order they are reduced.
  const std::vector<detail::gradient_bucket>& buckets() const noexcept { return reducer_->buckets(); }
  /// Replicas in all: replicas() × processes.
  std::size_t global_replicas() const noexcept { return replicas_.size() * comm_.size(); }

  /// Rank 0's replica 0 initialises the variables from `seed`; every replica of every process
  /// receives them.
  void initialize(std::uint64_t seed) {
    settle();
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
    reducer_->begin_step([this](std::size_t k, const detail::gradient_bucket& b) {
      if (reducer_->overlapping()) average_replicas(b.begin, b.end);
      if (comm_.size() == 1) return;
      const std::string name = "mirrored/gradients/" + std::to_string(k);
#if DTF_CUDA
      if (staging_)  // the NCCL path: replica 0's average, through the pinned buffer (section 2.1)
        return staging_->reduce(b, comm_, name, replicas_[0]->grads.template data<float>(), reduced_.data(),
                                replicas_[0]->comm_stream());
#endif
      comm_.allreduce<float>(name, reduced_.span().subspan(b.begin, b.size()), reduce_op::average);
    });
    const auto body = [&](std::size_t k) {
      try {
        replica_step(k, batches[k], barrier, lr);
      } catch (...) {
        failures[k] = std::current_exception();
        barrier.break_barrier();
      }
    };
    threads_->run(body);
    if (std::any_of(failures.begin(), failures.end(), [](const auto& f) { return bool(f); })) reducer_->abort_step();
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
    // One process on the NCCL path: the loss's copy, issued after the group (every process's
    // loss is already in reduced_[0] otherwise).
    if (staging_ && comm_.size() == 1) staging_->wait_loss();
    ++step_;
    return reduced_[0];
  }

  /// The rate of the next step.
  float learning_rate() const {
    if (config_.schedule) return config_.schedule(step_);
    const float base = optim::detail::base_learning_rate(config_.rule);
    if (!config_.linear_scaling) return base;
    return optim::linear_scaling_warmup{.base_rate = base, .scale = float(global_replicas()),
                                        .warmup_steps = std::max<std::int64_t>(0, config_.warmup_steps)}(step_);
  }

  /// Replica k's variables (every replica holds the same values).
  std::span<const float> parameters(std::size_t k = 0) const {
    replicas_.at(k)->settle();  // the update may still run on the replica's compute stream
    return replicas_[k]->params.template span<const float>();
  }
  /// Replica k's model.
  M& model(std::size_t k = 0) { return replicas_.at(k)->net; }
  /// The global step: steps taken so far (or restored).
  std::int64_t global_step() const noexcept { return step_; }
  /// The mean gradient's global norm before clipping at the last step (0 without clip_norm). On
  /// the NCCL path it is read from replica 0's device when called (the host waits for its stream).
  float gradient_norm() const {
#if DTF_CUDA
    if (reduces_on_gpus() && config_.clip_norm > 0.0f) {
      on_device(0);
      return float(replicas_[0]->clip.norm(replicas_[0]->exec.stream()));
    }
#endif
    return last_norm_;
  }

  /// Replica k's update-rule state, for checkpoints (every replica holds the same).
  const optim::optimizer<>& optimizer(std::size_t k = 0) const {
    replicas_.at(k)->settle();
    return replicas_[k]->opt;
  }
  /// Restores a saved state into every replica of this process: the parameters, the rule's
  /// slots and update count (host buffers) and the global step (which drives the warm-up).
  /// Every process must restore the same state. Errors: errc::shape_mismatch.
  void restore(std::span<const float> values, std::span<const std::vector<float>> slots, std::int64_t iterations,
               std::int64_t global_step) {
    settle();  // no step's work still reads what is overwritten
    for (std::size_t k = 0; k < replicas_.size(); ++k) {
      on_device(k);
      replicas_[k]->params.template copy_from_host<float>(values);
      replicas_[k]->opt.load_host_slots(slots, iterations);
    }
    on_device(0);
    step_ = global_step;
  }

 private:
  using replica = detail::mirrored_replica<M>;

  // The host waits for every replica's streams (no-op on CPU builds).
  void settle() const {
    for (std::size_t k = 0; k < replicas_.size(); ++k) {
      on_device(k);
      replicas_[k]->settle();
    }
    on_device(0);
  }

  static void on_device([[maybe_unused]] std::size_t k) {
#if DTF_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) cudaSetDevice(int(k % std::size_t(count)));
#endif
  }

  // Replica k's share of step 1-4 (set_batch: no host wait, see mean_to_device).
  void replica_step(std::size_t k, const data::host_batch& b, detail::replica_barrier& barrier, float lr) {
    const auto timeout = std::chrono::milliseconds(config_.timeout_ms);
    replica& rep = *replicas_[k];
    rep.set_batch(b);
    const auto params = rep.params.template span<const float>();
    const auto grads = rep.grads.template span<float>().subspan(pre, n_);
    float loss = 0;
    if (rep.micro.passes() > 1) {
      rep.settle();  // the passes slice the batch with Thrust's blocking policy
      loss = rep.micro.loss_and_gradients(rep.net, params, rep.x, rep.y, grads);
    } else if constexpr (streams_gradients<M>) {
      if (reducer_->overlapping())
        loss = rep.net.loss_and_gradients(params, rep.x, rep.y, grads, gradient_ready_fn([this](std::size_t first, std::size_t count) {
                                            reducer_->report(pre + first, count);
                                          }));
      else
        loss = rep.net.loss_and_gradients(params, rep.x, rep.y, grads);
    } else {
      loss = rep.net.loss_and_gradients(params, rep.x, rep.y, grads);
    }
#if DTF_MIRRORED_NCCL
    if constexpr (Nccl)
      if (nccl_) return nccl_step(k, loss, barrier, lr);
#endif
#if DTF_CUDA
    // The host averages them; its wait for the compute stream orders reduced_'s writes (mean_to_device).
    rep.gradients_to_host(loss);
#else
    rep.write_prefix(loss);
#endif
    barrier.arrive_and_wait(timeout);
    if (!reducer_->overlapping()) {
      // Replica k averages slice k of everyone's gradients (and the loss) into reduced_.
      const std::size_t r = replicas_.size(), total = pre + n_;
      average_replicas(total * k / r, total * (k + 1) / r);
      barrier.arrive_and_wait(timeout);
    }
    // Across processes, bucket by bucket (with overlap: the buckets not reduced yet, and the
    // replicas' average of each first).
    if (k == 0) reducer_->finish();
    if (k == 0 && config_.clip_norm > 0.0f)  // the mean of every replica of every process
      last_norm_ = float(optim::clip_by_global_norm<optim::host_space>(reduced_.span().subspan(pre, n_),
                                                                       config_.clip_norm));
    barrier.arrive_and_wait(timeout);
    const auto mean = std::as_const(reduced_).span().subspan(pre, n_);
#if DTF_CUDA
    rep.mean_to_device(mean.data(), n_);
    rep.opt.apply(rep.params.template span<float>(), rep.grads.template span<const float>().subspan(pre, n_), lr);
#else
    rep.opt.apply(rep.params.template span<float>(), mean, lr);
#endif
  }

  // reduced_[i] = the replicas' mean of floats i in [begin, end) (detail::average_replicas).
  void average_replicas(std::size_t begin, std::size_t end) {
    detail::average_replicas<M>(replicas_, reduced_.data(), begin, end);
  }

#if DTF_MIRRORED_NCCL
  // Steps 2–4 with NCCL (docs/design/gpu-execution.md, section 2.1): the replicas' gradients
  // (the loss in slot 0) averaged in place on their GPUs, on their communication streams after
  // an event of their compute streams; with several processes replica 0 averages them across
  // processes bucket by bucket through the pinned buffer and broadcasts the result to the other
  // replicas; the clip and the update on each compute stream after its communication stream.
  void nccl_step(std::size_t k, float loss, detail::replica_barrier& barrier, float lr) {
    const auto timeout = std::chrono::milliseconds(config_.timeout_ms);
    replica& rep = *replicas_[k];
    rep.write_prefix(loss);
    rep.comm_after_compute();  // the NCCL calls below are issued on this communication stream
    barrier.arrive_and_wait(timeout);
    if constexpr (Nccl)  // (mirrored<M, false> instantiates this member but never calls it)
      if (k == 0) {
        nccl_->average(pre + n_);
        if (comm_.size() > 1) {
          reducer_->finish();  // across processes, bucket by bucket (the host waits per bucket)
          nccl_->broadcast(pre + n_);  // after replica 0's copies back, on its communication stream
        } else {
          staging_->loss_to_host(rep.grads.template data<float>(), reduced_.data(), rep.comm_stream());
        }
      }
    barrier.arrive_and_wait(timeout);  // the group's calls are issued before the compute streams wait
    rep.compute_after_comm();          // the clip and the update read the average
    const auto grads = rep.grads.template span<float>().subspan(pre, n_);
    if (config_.clip_norm > 0.0f) rep.clip.apply(rep.exec.stream(), grads, config_.clip_norm);
    rep.opt.apply(rep.params.template span<float>(), std::span<const float>(grads), lr);
  }
#endif

  static constexpr std::size_t pre = detail::exchange_prefix;

  communicator& comm_;
  mirrored_config config_;
  std::size_t n_;
  detail::pinned_floats reduced_;  // [loss, 15 zeros, the mean gradient]; pinned on CUDA builds
  // Null (or nothing, without NCCL): the host path. Its type depends on Nccl only, never on
  // the translation unit, so that mirrored<M, false> has one layout everywhere. Before the
  // replicas: their contexts drain the streams NCCL's calls were issued on before it goes.
  std::conditional_t<Nccl, std::unique_ptr<detail::nccl_replica_group>, detail::no_replica_group> nccl_;
  std::unique_ptr<detail::replica_staging> staging_;  // the NCCL path's (null otherwise)
  std::vector<std::unique_ptr<replica>> replicas_;
  std::int64_t step_ = 0;
  float last_norm_ = 0;
  std::unique_ptr<detail::bucket_reducer> reducer_;
  std::unique_ptr<detail::replica_threads> threads_;  // last: its threads stop before the replicas go
};

}  // namespace dtf::strategies
