// dtf/strategies/ring_exchange.hpp — ring_allreduce's exchange of the gradient buckets: the
// buckets and their reducer (dtf/strategies/gradient_buckets.hpp), the backend they travel on
// (the TCP ring, through pinned staging on CUDA builds with several ranks: pinned_staging.hpp;
// or NCCL on the context's communication stream: nccl_exchange.hpp), the replan after the first
// step, and the health of a device exchange (docs/design/gpu-execution.md, sections 6.0, 6.1, 7).
//
//   detail::ring_exchange x(comm, net, grads, backend, bucket_bytes, overlap, streams, ctx);
//   each step: x.begin_step();  backprop reports through x.report(net, first, count);
//              x.finish(compute);  [update]  x.end_step(net, settle);
//   a failed backprop: x.abort_step();
//   the engine's teardown: x.drain_or_abort(); [graphs dropped]; x.release_device();
//
// The buckets are reduced in order k = 0, 1, ... on every rank, by the reducer's communication
// thread when it overlaps backprop, else by the training thread in finish(); set_overlap(false)
// rebuilds the reducer without its thread (the same buckets: a CUDA graph's capture belongs to
// the training thread, section 7). A model that orders its ready callbacks on the device
// (nn::sequential::set_ready_on_device) leaves each layer's event to the staging or the NCCL
// exchange (ready_on_device()), which makes the bucket's copy or allreduce wait for it.
// Thread safety: the engine's thread, and the reducer's for reduce().
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/config.hpp>
#include <dtf/device/context.hpp>
#include <dtf/strategies/engine_context.hpp>
#include <dtf/strategies/gradient_buckets.hpp>
#include <dtf/strategies/nccl_exchange.hpp>
#include <dtf/strategies/pinned_staging.hpp>
#include <dtf/tensor.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::strategies::detail {

/// The exchange of one engine's gradient buckets (see the file comment).
class ring_exchange {
 public:
  /// The buckets of `net`'s gradient in `grads` ([loss, 15 zeros, gradient], exchange_prefix +
  /// the parameters' count floats) over `comm`, on `backend`, cut every `bucket_bytes`;
  /// `overlap`: reduce on a communication thread (with a model that `streams` its gradients and
  /// several ranks); `ctx`: the engine's context; `strategy` names the engine in errors.
  template <class M>
  ring_exchange(communicator& comm, M& net, tensor& grads, exchange_backend backend, std::size_t bucket_bytes,
                bool overlap, bool streams, device::context& ctx, std::string strategy)
      : comm_(comm), grads_(grads), ctx_(ctx), strategy_(std::move(strategy)), bucket_bytes_(bucket_bytes),
        overlap_(overlap && streams && comm.size() > 1) {
    auto buckets = plan_buckets(net.variables(), exchange_prefix, bucket_bytes);
    exchange_ = select_exchange(backend, comm, grads, buckets, ctx, strategy_);
    reducer_ = std::make_unique<bucket_reducer>(std::move(buckets), overlap_, 1, current_device_setter());
    reducer_->record_reports(replan_ = streams && comm.size() > 1 && bucket_bytes > 0);  // end_step
    name_buckets();
#if DTF_CUDA
    if (!exchange_ && comm.size() > 1)  // the TCP ring: the buckets through pinned memory
      staging_ = std::make_unique<pinned_staging>(reducer_->buckets(), buffer_end(reducer_->buckets()));
#endif
  }
  ring_exchange(const ring_exchange&) = delete;
  ring_exchange& operator=(const ring_exchange&) = delete;

  /// The NCCL exchange (null: the TCP ring).
  device_exchange* device() const noexcept { return exchange_.get(); }
  /// Whether the buckets are reduced while backprop runs.
  bool overlapping() const noexcept { return reducer_->overlapping(); }
  /// The buckets, in the order they are reduced.
  const std::vector<gradient_bucket>& buckets() const noexcept { return reducer_->buckets(); }
  /// Whether a step passes the model a ready callback (report()): to overlap, to record the first
  /// step's order for the replan, to note the layers' events for NCCL, and on CPU builds.
  bool wants_reports() const noexcept {
    return device_memory_is_host_accessible || reducer_->overlapping() || replan_ || exchange_ != nullptr;
  }
  /// Whether the model leaves each layer's event to the exchange (ready_guard; CUDA builds).
  bool ready_on_device() const noexcept { return staged() || exchange_ != nullptr; }

  /// Reduce on the communication thread (`on`, as configured) or on the training thread (off):
  /// the reducer is rebuilt with the same buckets when that changes. Between steps only.
  void set_overlap(bool on) {
    if ((on && overlap_) == reducer_->overlapping()) return;
    auto next = std::make_unique<bucket_reducer>(reducer_->buckets(), on && overlap_, 1, current_device_setter());
    next->record_reports(replan_);
    reducer_ = std::move(next);
  }

  /// A new step (training thread).
  void begin_step() {
    reducer_->begin_step([this](std::size_t k, const gradient_bucket& b) { reduce(k, b); });
#if DTF_CUDA
    if (staging_) staging_->begin_step();
#endif
    if (exchange_) exchange_->begin_step();
  }
  /// Floats [first, first + count) of the gradient (gradient coordinates) are final, from the
  /// model's ready callback (its layer's event noted first where it leaves the wait to us).
  template <class M>
  void report(const M& net, std::size_t first, std::size_t count) {
#if DTF_CUDA
    if (staging_) staging_->note(exchange_prefix + first, count, ready_event(net));
    if (exchange_) exchange_->note(exchange_prefix + first, count, ready_event(net));
#else
    (void)net;
#endif
    reducer_->report(exchange_prefix + first, count);
  }
  /// Backprop failed: nothing more is reduced; a device exchange's work ends (the other ranks'
  /// waits end at their bound).
  void abort_step() noexcept {
    reducer_->abort_step();
    if (exchange_) exchange_->abort();
  }
  /// Every gradient and the loss's slot are issued on `compute`: the remaining buckets are
  /// reduced and the compute stream waits for the averages on the device (rules 1 and 5 of
  /// section 6.0; section 6.1). No host wait for NCCL.
  void finish(device::stream_t compute) {
#if DTF_CUDA
    if (staging_) staging_->gradients_written(compute);
    if (exchange_) exchange_->gradients_written();
    reducer_->finish();
    if (staging_) ctx_.compute_waits_for_comm();
#else
    (void)compute;
    reducer_->finish();
#endif
    if (exchange_) exchange_->finish();
  }
  /// After the step's update, outside any graph: the step marked done for the health check; after
  /// the first step the buckets are cut again in rank 0's report order (`settle()` first: no copy
  /// still reads the old staging).
  template <class M, class Settle>
  void end_step(M& net, Settle&& settle) {
    if (exchange_) exchange_->end_step();
    if (!replan_) return;
    replan_ = false;
    auto b = replan_after_first_step(comm_, strategy_ + "/bucket_order", net.variables(), exchange_prefix,
                                     bucket_bytes_, *reducer_);
    settle();
    reducer_ = std::make_unique<bucket_reducer>(std::move(b), reducer_->overlapping(), 1, current_device_setter());
    name_buckets();
    if (exchange_) exchange_->set_buckets(reducer_->buckets());
#if DTF_CUDA
    if (staging_) staging_ = std::make_unique<pinned_staging>(reducer_->buckets(), buffer_end(reducer_->buckets()));
#endif
  }

  /// The engine's teardown, first: a device exchange's bounded wait for both streams; on its
  /// failure the communicator is aborted (its kernels end), so the unbounded drains after it
  /// (the graphs', the context's) cannot hang.
  void drain_or_abort() noexcept {
    if (!exchange_) return;
    try {
      exchange_->wait("the engine's teardown");
    } catch (...) {
      exchange_->abort();
    }
  }
  /// After the graphs that captured its collectives are gone: the device exchange is finalised
  /// (or aborted) while the context's streams still exist.
  void release_device() noexcept {
    reducer_.reset();  // its thread stops first: it may call reduce()
    exchange_.reset();
  }

 private:
  bool staged() const noexcept {
#if DTF_CUDA
    return staging_ != nullptr;
#else
    return false;
#endif
  }

  // Bucket k's allreduce (average), in place; CUDA builds stage it through pinned memory on the
  // communication stream (section 6.0) or hand it to NCCL (section 6.1).
  void reduce(std::size_t k, const gradient_bucket& b) {
    if (exchange_) return exchange_->reduce(k, b);
    const std::string& name = names_.at(k);
#if DTF_CUDA
    if (!staging_) return;  // one rank: the average is its gradient, left on the device
    staging_->reduce(k, b, comm_, name, grads_.data<float>(), ctx_.comm_stream());
#else
    comm_.allreduce<float>(name, grads_.span<float>().subspan(b.begin, b.size()), reduce_op::average);
#endif
  }

  // "<strategy>/gradients/k", each bucket's tensor name on the ring, built once per plan.
  void name_buckets() {
    names_.resize(reducer_->buckets().size());
    for (std::size_t k = 0; k < names_.size(); ++k) names_[k] = strategy_ + "/gradients/" + std::to_string(k);
  }

  communicator& comm_;
  tensor& grads_;
  device::context& ctx_;
  std::string strategy_;
  std::vector<std::string> names_;  // name_buckets()
  std::size_t bucket_bytes_;
  bool overlap_;         // as configured (set_overlap(true) restores it)
  bool replan_ = false;  // the buckets are cut again after the first step (end_step)
  std::unique_ptr<device_exchange> exchange_;  // null: the TCP ring
  std::unique_ptr<bucket_reducer> reducer_;    // its thread stops before the exchange goes
#if DTF_CUDA
  std::unique_ptr<pinned_staging> staging_;  // the TCP ring with several ranks; freed after the context drains
#endif
};

}  // namespace dtf::strategies::detail
