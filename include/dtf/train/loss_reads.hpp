// dtf/train/loss_reads.hpp — a collective step's loss read by the host at the hooks' cadence, not
// per step (docs/design/gpu-execution.md, section 5): where the model leaves its loss on the
// device (dtf::defers_loss, e.g. nn::sequential) and the engine can step without reading it
// (ring_allreduce's step_deferred; also the single-process run, a ring of one rank), dtf::train
// pushes each step's loss into a device::loss_ring and hands the hooks, in run_values::
// landed_losses, the losses that reached the host (run_values::loss stays empty).
//
// When the host reads (the only host waits; a CUDA build's poll only asks events):
//   every step        a poll: the entries whose copies have landed, never waiting;
//   a drain           waits for every entry in flight: at each logging hook's line (every
//                     train_options::log_every local steps), when summaries are asked for (the
//                     summary hook then writes the step's own loss), and at every step from the
//                     run's last step on (a run ending at its step limit hands every loss to the
//                     hooks); after the loop, the rest (train_result::loss).
// The ring has max(log_every, summary_every) slots (at least 1), so with a drain every log_every
// steps a push never waits. A NaN or infinite loss reaches the NaN hook at the step itself with
// log_every = 1, else within log_every steps (by its next drain); the hook names the step whose
// loss it was. An engine that watches the ring (ring_allreduce::watch_losses) pushes each loss
// itself, on its compute stream, before its update, and its update kernels read the ring's flag:
// the bad step and those between it and its read apply nothing, so the parameters stay those of
// the step before. Other engines' losses are pushed here, after the step, from the legacy stream.
// With NCCL, the watching engine also hands the ring its exchange's health check
// (loss_ring::set_wait_check): a drain or a full ring's push on a device stuck behind a dead
// peer ends with errc::timeout or errc::peer_failure within the ring's timeout_ms, not a hang
// (docs/design/gpu-execution.md, section 6.1).
// CPU builds: the ring's copies are immediate, so every poll returns the step just pushed and a
// NaN is caught at its own step whatever log_every is.
// A stop that comes otherwise (a signal, another rank, a hook) can leave up to log_every - 1
// losses that no hook sees; train_result::loss still gets the last one.
#pragma once

#include <dtf/device/loss_ring.hpp>
#include <dtf/session.hpp>
#include <dtf/train/options.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

namespace dtf::detail {

/// Whether `Batches` can run a step of `Engine` that leaves the loss on the device
/// (batches.step_deferred(engine); engine.device_loss()).
template <class Engine, class Batches>
concept defers_step_loss = requires(Engine& e, Batches& b) {
  b.step_deferred(e);
  { e.device_loss() } -> std::convertible_to<const float*>;
};

/// Whether `Engine` pushes its losses into a ring itself, before its update (watch_losses).
template <class Engine>
concept watches_losses = requires(Engine& e, device::loss_ring* r) { e.watch_losses(r); };

/// The ring of a run's losses and when it is read (see the file comment).
class step_losses {
 public:
  /// The reads of a run whose last global step is `last_step` when the engine and the batches can
  /// leave the loss on the device and o.loss_ring is on; else nullopt (the loss read per step).
  template <class Engine, class Batches>
  static std::optional<step_losses> make(const train_options& o, std::int64_t last_step) {
    if constexpr (defers_step_loss<Engine, Batches>)
      if (o.loss_ring) return std::optional<step_losses>(std::in_place, o, last_step);
    return std::nullopt;
  }

  /// One step of `batches` on `engine`: through `losses` when it is set (after_step), else with its
  /// loss returned in v.loss (and result.loss).
  template <class Batches, class Engine>
  static void step(Batches& batches, Engine& engine, std::optional<step_losses>& losses, const run_context& ctx,
                   run_values& v, train_result& result) {
    if constexpr (defers_step_loss<Engine, Batches>) {
      if (losses) {
        if constexpr (watches_losses<Engine>) losses->watch(engine);
        batches.step_deferred(engine);
        losses->after_step(ctx, engine.global_step(), engine.device_loss(), v, result);
        return;
      }
    }
    v.loss = double(batches.step(engine));
    result.loss = *v.loss;
  }

  /// For a run whose last global step is `last_step`.
  step_losses(const train_options& o, std::int64_t last_step)
      : ring_(std::size_t(std::max({o.log_every, o.summary_every, 1}))), log_every_(o.log_every),
        last_step_(last_step) {}
  step_losses(const step_losses&) = delete;
  step_losses& operator=(const step_losses&) = delete;
  /// The engine that watched the ring stops (it must outlive this).
  ~step_losses() {
    if (unwatch_) unwatch_();
  }

  /// From the next step on, `engine` pushes the losses into the ring and reads its flag (once).
  template <class Engine>
  void watch(Engine& engine) {
    if (unwatch_) return;
    engine.watch_losses(&ring_);
    unwatch_ = [&engine] { engine.watch_losses(nullptr); };
  }

  /// After a step that left its loss at `device_loss` and reached global step `step`: pushes it
  /// (unless the engine did: watch(); else it was written by work on the legacy default stream),
  /// reads what the cadence asks for into v.landed_losses, and keeps the latest in result.loss.
  void after_step(const run_context& ctx, std::int64_t step, const float* device_loss, run_values& v,
                  train_result& result) {
    if (!unwatch_) ring_.push(step, device_loss);
    const std::int64_t iteration = ctx.local_step() + 1;  // as the logging hook counts
    const bool drain = ctx.summaries_requested() || (log_every_ > 0 && iteration % log_every_ == 0) ||
                       step >= last_step_;
    take(drain ? ring_.drain() : ring_.poll(), &v, result);
  }

  /// After the loop: waits for the losses in flight; result.loss gets the last.
  void finish(train_result& result) { take(ring_.drain(), nullptr, result); }

 private:
  static void take(const std::vector<device::step_loss>& landed, run_values* v, train_result& result) {
    if (v)
      for (const auto& e : landed) v->landed_losses.emplace_back(e.step, double(e.loss));
    if (!landed.empty()) result.loss = double(landed.back().loss);
  }

  device::loss_ring ring_;
  std::int64_t log_every_, last_step_;
  std::function<void()> unwatch_;  // set by watch()
};

}  // namespace dtf::detail
