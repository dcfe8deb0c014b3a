// dtf/strategies/ring_allreduce.hpp — synchronous data-parallel training without parameter
// servers (Horovod's scheme): every rank holds the whole model, computes gradients on its
// shard of the batch, the gradients are averaged with a ring allreduce, and every rank applies
// the same optimiser step, so the replicas stay bitwise identical.
//
//   dtf::communicator comm = dtf::make_communicator(cluster, options);
//   dtf::strategies::ring_allreduce<dtf::nn::sequential> s(comm, net, {.rule = dtf::optim::adam{1e-3f}});
//   s.initialize(seed);                 // rank 0 initialises, everyone receives its values
//   for (...) loss = s.step(batch);     // the loss averaged over every rank's shard
//   s.step_deferred(batch);             // models that defer their loss: left at s.device_loss()
//
// With plain SGD, n ranks at batch B compute exactly the update one process computes at batch
// n·B (the mean of equal-size means is the mean), up to float rounding.
//
// Communication per step: the model's gradients plus the loss (one buffer, see
// dtf/strategies/gradient_buckets.hpp), 2(n-1)/n of the model's bytes sent and received per
// rank, reduced as buckets of config.bucket_bytes cut at variable boundaries from the top
// layer down, one allreduce each, always in that order; a streaming model's are cut again after
// the first step in the order it reported them (rank 0's; as DDP rebuilds, gradient_buckets.hpp).
//
// Overlap (config.overlap, on by default): when the model reports each variable's gradient as
// backprop produces it (dtf::streams_gradients, e.g. dtf::nn::sequential), a communication
// thread allreduces each bucket as soon as it is complete, while backprop computes the layers
// below; the optimiser step waits for the last bucket. The buckets and their order are the same
// with overlap off (every bucket reduced after backprop), so the parameters are bitwise
// identical either way. A model that does not stream its gradients is reduced after backprop.
//
// The training loop's extras (config): learning-rate schedules (`schedule`, any
// dtf/optim/schedule.hpp schedule of the global step), gradient clipping by global norm after
// the reduce (`clip_norm`: every rank clips the same averaged gradient, so the replicas stay
// equal; on the device, dtf/optim/device_clip.hpp), micro-batch accumulation
// (`backward_passes_per_step`, dtf/strategies/micro_batches.hpp: the passes' gradients are summed
// locally and reduced once per step; no overlap then; step_deferred sums their losses on the device).
// The device (docs/design/gpu-execution.md): the engine owns a device::context (engine_context.hpp;
// a CPU twin on CPU builds) and issues the model's step, the loss's slot and the update on its
// compute stream; one rank exchanges nothing and waits for no layer; several ranks on the TCP ring
// stage the buckets through pinned memory on the communication stream (pinned_staging.hpp, §6.0);
// NCCL runs on that stream with no per-step host wait, its health checked where the host waits
// (nccl_exchange.hpp, §6.1). The buckets' exchange: ring_exchange.hpp.
// watch_losses(ring): each deferred step pushes its averaged loss into a device::loss_ring before
// its update, whose kernels skip from a non-finite loss on. use_step_graphs(true): the deferred
// step as CUDA graphs on one rank or with NCCL (engine_graph.hpp, §7).
// Errors: those of dtf::communicator (a dead or mismatched rank fails every rank).
// Thread safety: one thread per instance.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/concepts.hpp>
#include <dtf/config.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/device/batch_upload.hpp>
#include <dtf/device/loss_ring.hpp>
#include <dtf/error.hpp>
#include <dtf/host.hpp>
#include <dtf/optim/clip.hpp>
#include <dtf/optim/device_clip.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/optim/schedule.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/strategies/engine_context.hpp>
#include <dtf/strategies/engine_graph.hpp>
#include <dtf/strategies/gradient_buckets.hpp>
#include <dtf/strategies/micro_batches.hpp>
#include <dtf/strategies/nccl_exchange.hpp>
#include <dtf/strategies/pinned_staging.hpp>
#include <dtf/strategies/ring_exchange.hpp>
#include <dtf/tensor.hpp>

#if DTF_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dtf::strategies {

/// ring_allreduce's knobs.
struct ring_allreduce_config {
  optim::rule rule = optim::adam{.learning_rate = 1e-3f};  ///< applied by every rank to the average
  /// Multiply the rule's rate by the number of ranks (Goyal et al. 2017), reached linearly
  /// over warmup_steps; off: the rule's rate as given.
  bool linear_scaling = false;
  /// Steps over which the scaled rate is reached (linear_scaling).
  std::int64_t warmup_steps = 0;
  /// Allreduce each bucket of gradients on a communication thread as soon as backprop has
  /// produced it (models that stream their gradients; see the file comment). Off: the same
  /// buckets are reduced after backprop. The parameters are the same bit for bit either way.
  bool overlap = true;
  /// Fusion: gradients travel in buckets of at least this many bytes, cut at variable
  /// boundaries (0: one bucket, the whole gradient). Every rank must use the same value.
  std::size_t bucket_bytes = std::size_t(4) << 20;
  /// The learning rate at each global step (e.g. optim::cosine_decay, optim::piecewise_constant,
  /// optim::exponential_decay); empty: the rule's rate (with linear_scaling). Not with
  /// linear_scaling (errc::invalid_config): fold the scaling into the schedule.
  std::function<float(std::int64_t global_step)> schedule{};
  /// Clip the averaged gradient to this global L2 norm before the update, as
  /// torch.nn.utils.clip_grad_norm_ (dtf/optim/clip.hpp); 0: no clipping.
  float clip_norm = 0.0f;
  /// Backward passes per step (Horovod's backward_passes_per_step): each rank's batch runs as
  /// this many micro-batches whose gradients are accumulated before the one allreduce of the
  /// step (dtf/strategies/micro_batches.hpp); 1: one pass.
  int backward_passes_per_step = 1;
  /// Where the gradients' buckets are averaged (dtf/strategies/nccl_exchange.hpp): automatic is
  /// NCCL on CUDA builds linking dtf::nccl when the parameters are in device memory and each rank
  /// has its own GPU, the TCP ring otherwise; nccl on a build without it: errc::invalid_config at
  /// construction. Every rank must use the same value.
  exchange_backend backend = exchange_backend::automatic;
};

template <class M = void>
class ring_allreduce;

/// The strategy value dtf::train takes (dtf::strategy, kind collective):
///   dtf::train(cluster, net, data, dtf::strategies::ring_allreduce<>({.rule = ...}), options)
/// It holds the config; train builds the engine ring_allreduce<M> (below) on every rank.
template <>
class ring_allreduce<void> {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = ring_allreduce_config;
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::collective;
  /// dtf::strategy (collective): the per-task engine for a model M.
  template <model M>
  using engine = ring_allreduce<M>;

  ring_allreduce() = default;
  /// A strategy with the given knobs.
  explicit ring_allreduce(config_type c) : config(c) {}
  /// One batch per process and step.
  std::size_t replicas_per_process() const noexcept { return 1; }
  /// dtf::strategy (collective): builds this task's engine over `comm` for the model.
  template <model M>
  engine<M> make(communicator& comm, M& net) const {
    return engine<M>(comm, net, config);
  }

  /// The knobs every engine gets.
  config_type config;
};
static_assert(check_strategy<ring_allreduce<>>(),
              "ring_allreduce<> must model dtf::strategy: config_type, kind, replicas_per_process(), engine<M>");

/// The engine: one rank's replica of the model and its optimiser.
template <model M>
class ring_allreduce<M> {
 public:
  /// This rank's engine: model `net` trained with the other ranks of `comm`.
  ring_allreduce(communicator& comm, M& net, ring_allreduce_config config = {})
      : comm_(comm), net_(net), config_(config), n_(num_parameters(net.variables())), params_({n_}),
        grads_({detail::exchange_prefix + n_}), optimizer_(config.rule, n_),
        micro_((detail::check_loop_config(config, "ring_allreduce"), config.backward_passes_per_step)) {
    const bool streams = streams_gradients<M> && config.backward_passes_per_step == 1;
    x_ex_ = std::make_unique<detail::ring_exchange>(comm, net, grads_, config.backend, config.bucket_bytes,
                                                    config.overlap, streams, device_.get(), "ring_allreduce");
    if (x_ex_->device())  // NCCL: the host's waits for the streams are bounded and health-checked (§6.1)
      device_.set_wait_guard([this](const std::string& what) {
        if (auto* d = x_ex_ ? x_ex_->device() : nullptr) d->wait("ring_allreduce: " + what);
      });
    optimizer_.set_stream(device_.stream());
  }
  ring_allreduce(const ring_allreduce&) = delete;
  ring_allreduce& operator=(const ring_allreduce&) = delete;
  /// NCCL's work ends first (a bounded wait, else an abort), then the graphs that captured it go
  /// and the communicator is finalised while the context's streams exist (§6.1's teardown).
  ~ring_allreduce() {
    if (!x_ex_) return;
    x_ex_->drain_or_abort();
    graph_.invalidate();
    x_ex_->release_device();
  }

  /// Rank 0 initialises the parameters from `seed`; every rank receives them.
  void initialize(std::uint64_t seed) {
    if (comm_.rank() == 0) net_.initialize(params_.template span<float>(), seed);
    comm_.broadcast("ring_allreduce/params", params_, 0);
  }

  /// One synchronous step on this rank's batch: gradients, allreduce (average, by buckets,
  /// overlapping backprop where the model streams its gradients), update. Returns the loss
  /// averaged over the ranks' batches.
  float step(const data::host_batch& b) {
    stage(b);
    return step_on(x_, y_);
  }

  /// The same step on a batch already in device memory (features x float32 [rows, ...], labels
  /// y int32 [rows]), e.g. gathered by a data::device_shard: nothing is copied from the host.
  float step(const tensor& x, const tensor& y) { return step_on(x, y); }

  /// dtf::train's form: this rank's one batch (errc::invalid_argument for any other count).
  float step(std::span<const data::host_batch> batches) {
    return step(one_batch(batches));
  }

  /// The same steps without reading the loss back, for a model that leaves its loss on the device
  /// (dtf::defers_loss, e.g. nn::sequential): the loss averaged over the ranks is left at
  /// device_loss() (dtf::train reads it through a device::loss_ring at the hooks' cadence). The
  /// parameters are those of step() bit for bit.
  ///@{
  void step_deferred(const tensor& x, const tensor& y)
    requires defers_loss<M>
  {
    step_on(x, y, true);
  }
  void step_deferred(std::span<const data::host_batch> batches)
    requires defers_loss<M>
  {
    stage(one_batch(batches));
    step_on(x_, y_, true);
  }
  ///@}
  /// The loss of the last step averaged over the ranks, in device memory (host memory on CPU
  /// builds), written by the step's work on stream().
  const float* device_loss() const { return grads_.template data<float>(); }

  /// The engine's execution context, and its compute stream (CUDA builds; a placeholder on CPU
  /// builds): the step's work is ordered there; a batch gathered on the device for the step
  /// (data::device_shard::set_stream) belongs there too.
  ///@{
  device::context& context() const noexcept { return device_.get(); }
  device::stream_t stream() const noexcept { return device_.stream(); }
  ///@}

  /// From now on each step_deferred pushes its averaged loss into `ring` (as global step
  /// global_step() + 1, on stream()) before its update, and the update applies nothing once the
  /// ring's flag says a loss was NaN or infinite (read on the device: the parameters stay those
  /// of the step before the first bad loss). Null: neither. `ring` must outlive the steps; with
  /// NCCL its waits check the exchange's health (§6.1), so it must stay alive, and the engine
  /// too, until watch_losses(nullptr) or another ring (dtf::train does so).
  void watch_losses(device::loss_ring* ring) {
    if (ring_ && x_ex_->device()) ring_->set_wait_check({});
    ring_ = ring;
    if (ring && x_ex_->device())  // its waits cannot hang on a dead peer (§6.1)
      ring->set_wait_check([this](auto since) {
        if (auto* d = x_ex_->device()) d->check_health(since, "ring_allreduce: the loss ring's wait");
      });
    optimizer_.set_skip_flag(ring ? ring->device_flag() : nullptr);
    graph_.invalidate();  // the update reads another flag
  }

  /// Later deferred steps as CUDA graphs where they apply (docs/design/gpu-execution.md, section
  /// 7: one pass, one rank or NCCL (whose buckets are then reduced on this thread, inside the
  /// capture), a detail::graph_model in a capturable state; the CPU twin on CPU builds); off, or
  /// where they do not apply: eager. Returns whether they are on.
  bool use_step_graphs(bool on) {
    bool applies = false;
    if constexpr (defers_loss<M> && detail::graph_model<M>)
      applies = detail::step_graphs_apply(comm_.size(), x_ex_->device() != nullptr, micro_.passes());
    graph_.enable(on && applies, optimizer_);
    x_ex_->set_overlap(!graph_.enabled());
    return graph_.enabled();
  }
  /// The step graphs' cache (its counts per batch rows).
  const device::step_graphs& graphs() const noexcept { return graph_.graphs(); }

 private:
  // A host batch into x_, y_ through pinned slots on the stream the model reads them on (§3.1).
  void stage(const data::host_batch& b) {
    device_.bind();  // a model that takes a context reads the batch on the compute stream
    upload_.upload(x_, b.features, y_, b.labels, detail::takes_context<M> ? device_.stream() : device::stream_t{}, [this] { device_.settle(); });
  }

  static const data::host_batch& one_batch(std::span<const data::host_batch> batches) {
    if (batches.size() != 1)
      throw error(errc::invalid_argument, "ring_allreduce: one batch per step, got " + std::to_string(batches.size()));
    return batches.front();
  }

  // The step; `defer`: the model leaves its loss on the device (defers_loss) and the average
  // stays in the exchange buffer's first float (device_loss()); the return value is then 0.
  float step_on(const tensor& x, const tensor& y, bool defer = false) {
    constexpr std::size_t pre = detail::exchange_prefix;
    const auto grads = grads_.template span<float>().subspan(pre, n_);
    const auto params = params_.template span<const float>();
    device_.bind();
    if constexpr (requires { net_.fits(std::size_t{}); })  // the model waits on the host when its buffers grow:
      if (x_ex_->device() && !x.shape().empty() && !net_.fits(x.shape()[0]))  // bounded first (§6.1)
        device_.guard("the model's wait before its buffers grow");
    const bool graph = defer && graph_.begin_step(net_, x, y);
    x_ex_->begin_step();
    float loss = 0;
    bool loss_on_device = false;  // the model (or micro_) left its loss at its device_loss() (defer)
    auto report = [this](std::size_t first, std::size_t count) { x_ex_->report(net_, first, count); };
    // CUDA builds: a ready callback costs a host wait per layer unless the model leaves the
    // layer's event to the exchange (orders_ready_on_device); needed to overlap, for the replan,
    // and for NCCL's per-layer order on the device.
    const gradient_ready_fn ready = x_ex_->wants_reports() ? gradient_ready_fn(report) : gradient_ready_fn();
#if DTF_CUDA
    detail::ready_guard<M> guard(net_, x_ex_->ready_on_device());
#endif
    auto model_step = [&] {  // segment 0: the model's step and the loss's slot
      try {
        if (micro_.passes() > 1) {
          if constexpr (defers_loss<M> && detail::takes_context<M>)
            if (defer) {  // the passes on the compute stream, their losses summed there
              micro_.enqueue_loss_and_gradients(net_, params, x, y, grads, device_.stream());
              loss_on_device = true;
            }
          if (!loss_on_device) {
            device_.settle();  // the passes slice the batch with Thrust's blocking policy
            loss = micro_.loss_and_gradients(net_, params, x, y, grads);
          }
        } else if constexpr (defers_loss<M>) {
          if (defer) {
            net_.enqueue_loss_and_gradients(params, x, y, grads, ready);
            loss_on_device = true;
          } else {
            loss = net_.loss_and_gradients(params, x, y, grads, ready);
          }
        } else if constexpr (streams_gradients<M>) {
          loss = net_.loss_and_gradients(params, x, y, grads, ready);
        } else {
          (void)ready;
          loss = net_.loss_and_gradients(params, x, y, grads);
        }
      } catch (...) {
        x_ex_->abort_step();  // the other ranks' NCCL waits end at their bound
        throw;
      }
      const float* model_loss = nullptr;
      if constexpr (defers_loss<M>)
        if (loss_on_device) model_loss = micro_.passes() > 1 ? micro_.device_loss() : net_.device_loss();
      device_.write_prefix(grads_.template data<float>(), pre, model_loss, loss);
      // Graphs: the buckets' collectives (NCCL) inside the capture, forked and joined (§7).
      if (graph) x_ex_->finish(device_.stream());
    };
    if (graph) graph_.segment(0, device_.stream(), model_step);
    else model_step();
    // The buckets not reduced yet, then the update waits for the averages on the device.
    if (!graph) x_ex_->finish(device_.stream());
    if (config_.clip_norm > 0.0f) clip_.apply(device_.stream(), grads, config_.clip_norm);  // no host read
    if (defer && ring_) ring_->push(step_ + 1, device_loss(), device_.stream());  // before the update: its flag
    const float lr = learning_rate();
    if (graph_.enabled()) graph_.set_rate(device_.stream(), lr);  // the update reads it there
    auto update = [&] {  // segment 1
      optimizer_.apply(params_.template span<float>(), grads_.template span<const float>().subspan(pre, n_), lr);
    };
    if (graph) graph_.segment(1, device_.stream(), update);
    else update();
    if (graph && graph_.end_step(net_)) optimizer_.count_replayed_update();  // a replay ran no apply()
    ++step_;
    x_ex_->end_step(net_, [this] { device_.settle(); });  // outside the graphs: NCCL's health mark
    if (defer) return 0;
    return device_.read(device_loss());
  }

 public:
  /// The rate of the next step.
  float learning_rate() const {
    if (config_.schedule) return config_.schedule(step_);
    const float base = optim::detail::base_learning_rate(config_.rule);
    if (!config_.linear_scaling) return base;
    return optim::linear_scaling_warmup{.base_rate = base, .scale = float(comm_.size()),
                                        .warmup_steps = std::max<std::int64_t>(0, config_.warmup_steps)}(step_);
  }

  /// This rank's parameters (every rank holds the same values), once the steps issued so far
  /// have written them (CUDA builds: the host waits for the compute stream).
  ///@{
  std::span<const float> parameters() const {
    device_.settle();
    return params_.template span<const float>();
  }
  std::span<float> parameters() {
    device_.settle();
    return params_.template span<float>();
  }
  ///@}
  /// The global step: steps taken so far (or restored).
  std::int64_t global_step() const noexcept { return step_; }
  /// The averaged gradient's global norm before clipping at the last step (config.clip_norm;
  /// 0 without clipping), read from the device (CUDA builds: the host waits for the compute stream).
  float gradient_norm() const {
    if (config_.clip_norm <= 0.0f) return 0.0f;
    device_.guard("the gradient's norm");
    return float(clip_.norm(device_.stream()));
  }
  /// The communicator the ranks reduce over.
  communicator& comm() noexcept { return comm_; }
  /// Whether the gradients' buckets are reduced while backprop runs (config.overlap, a model
  /// that streams its gradients, more than one rank).
  bool overlaps() const noexcept { return x_ex_->overlapping(); }
  /// The backend the gradients are averaged on (tcp or nccl; config.backend resolved).
  exchange_backend backend() const noexcept { return x_ex_->device() ? exchange_backend::nccl : exchange_backend::tcp; }
  /// The buckets the gradients travel in ([begin, end) floats of [loss, 15 zeros, gradient]),
  /// in the order they are reduced.
  const std::vector<detail::gradient_bucket>& buckets() const noexcept { return x_ex_->buckets(); }

  /// The update rule's state, for checkpoints (every rank holds the same), once the steps issued
  /// so far have written it.
  const optim::optimizer<>& optimizer() const {
    device_.settle();
    return optimizer_;
  }
  /// Restores a saved state on this rank: the parameters, the rule's slots and update count
  /// (host buffers) and the global step (which drives the warm-up). Every rank must restore the
  /// same state (e.g. rank 0 reads a checkpoint and broadcasts it). Errors: errc::shape_mismatch.
  void restore(std::span<const float> values, std::span<const std::vector<float>> slots, std::int64_t iterations,
               std::int64_t global_step) {
    device_.settle();  // no step's work still reads what is overwritten
    params_.template copy_from_host<float>(values);
    optimizer_.load_host_slots(slots, iterations);
    step_ = global_step;
    graph_.invalidate();  // the next update copies the count from the host: not captured
  }

 private:
  communicator& comm_;
  M& net_;
  ring_allreduce_config config_;
  std::size_t n_;
  tensor params_, grads_, x_, y_;  // grads_: [loss, 15 zeros, the gradient]
  device::batch_upload upload_;  // stage()'s slots (freed after device_ drains)
  optim::optimizer<> optimizer_;
  detail::micro_batches micro_;
  std::int64_t step_ = 0;
  optim::device_clip clip_;  // config.clip_norm's, on the compute stream
  device::loss_ring* ring_ = nullptr;  // watch_losses'
  // The buckets, their reducer (its thread stops before the buffers go), the pinned staging
  // (freed after device_ drains) or NCCL (released by the destructor before device_ goes).
  std::unique_ptr<detail::ring_exchange> x_ex_;
  detail::engine_context<M> device_{net_};  // destroyed before the rest, its streams drained
  detail::engine_graph graph_;  // after device_: its graphs go first, waiting for their stream
};

}  // namespace dtf::strategies
