// dtf/strategies/engine_graph.hpp — ring_allreduce's deferred step on one rank as CUDA graphs
// (docs/design/gpu-execution.md, section 7): the model's step and the loss's slot (segment 0),
// then the update (segment 1), each captured on the engine's compute stream at a batch size's
// second step and replayed after (device::step_graphs); between them, outside the graphs, the
// loss ring's push (its slot and step change per step) and a one-thread kernel that writes the
// step's rate into a device float, which the update reads (optim::optimizer::set_rate_source),
// so a replayed update uses each step's rate, whatever the schedule.
//
//   detail::engine_graph graph;
//   graph.enable(true, optimizer);                // the optimizer reads its rate from graph
//   if (graph.begin(rows, x, y, net.storage_generation())) {
//     graph.segment(0, stream, model_step);  ... push ...  graph.set_rate(stream, lr);
//     graph.segment(1, stream, update);
//     if (graph.end(net.storage_generation())) optimizer.count_replayed_update();
//   }
//
// Where it applies (ring_allreduce::use_step_graphs, step_graphs_apply): one backward pass, one
// rank or the NCCL backend (its buckets' allreduces captured in segment 0 on the communication
// stream, forked from the compute stream by the layers' events and joined before the capture
// ends), a model that defers its loss, reports its storage generation and issues its step
// without a host read (graph_model: nn::sequential with trusted labels), and on CUDA builds no
// ready callback that waits on the host (one rank passes none; with NCCL the model leaves each
// layer's event to the exchange). Elsewhere (the TCP ring's host waits) the step stays eager. clip_norm's kernels run
// between the segments (optim::device_clip: no host read). A key is captured after its eager
// step, when the model's buffers fit its rows: an epoch's short last batch and the full batch
// after it only reshape them on the host (tensor::resize within capacity), which a capture holds.
// CPU builds: the CPU twin (every segment eager, the same bookkeeping), the rate read from host
// memory: the parameters are the eager step's bit for bit.
// Thread safety: one thread (the engine's).
#pragma once

#include <dtf/device/kernels.hpp>
#include <dtf/device/step_graph.hpp>
#include <dtf/tensor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace dtf::strategies::detail {

/// A model whose step can be captured: it says when a capture may be stale
/// (storage_generation()) and whether its step issues no host read (capturable_step()).
template <class M>
concept graph_model = requires(const M& m) {
  { m.storage_generation() } -> std::convertible_to<std::uint64_t>;
  { m.capturable_step() } -> std::convertible_to<bool>;
};

/// Whether a collective engine's deferred step may run as graphs: one backward pass per step,
/// and one rank or the NCCL backend (`nccl`; the TCP ring waits on the host). The model's part
/// (graph_model, capturable_step) is checked per step.
constexpr bool step_graphs_apply(std::size_t ranks, bool nccl, int passes) noexcept {
  return passes == 1 && (ranks == 1 || nccl);
}

/// One thread: *rate = value (the step's learning rate, a kernel argument).
struct write_rate {
  float* rate;
  float value;
  DTF_HD void operator()(std::size_t) const { *rate = value; }
};

/// The graphs of an engine's step and the rate they read (see the file comment).
class engine_graph {
 public:
  engine_graph() : rate_({1}), graphs_(std::make_unique<device::step_graphs>(2)) {}

  /// Whether steps go through the graphs (enable()).
  bool enabled() const noexcept { return on_; }
  /// Turns the graphs on or off for later steps; `optimizer` reads its rate from here while on.
  template <class Optimizer>
  void enable(bool on, Optimizer& optimizer) {
    on_ = on;
    optimizer.set_rate_source(on ? rate_.data<float>() : nullptr);
    graphs_->invalidate();
  }
  /// Drops every graph (a restore, a re-bind, another loss ring).
  void invalidate() { graphs_->invalidate(); }

  /// Starts a step of `rows` rows on the batch at x, y over the model's buffers of `generation`;
  /// false when the graphs are off (the step is then eager, as without them).
  bool begin(std::size_t rows, const void* x, const void* y, std::uint64_t generation) {
    if (!on_) return false;
    graphs_->begin(rows, x, y, generation);
    return true;
  }
  /// begin() for a step of `net` on batch x, y when the model can be captured now (a
  /// graph_model with capturable_step()); false otherwise (the step is eager). A key's capture
  /// follows its eager step, so the model's buffers already fit its rows (they only grow, and
  /// their growth moves the generation, which drops the graphs): reshaping them to its rows is a
  /// change of shape on the host (tensor::resize within capacity), which a capture holds.
  template <class M>
  bool begin_step(const M& net, const tensor& x, const tensor& y) {
    if constexpr (graph_model<M>)
      if (net.capturable_step() && !x.shape().empty())
        return begin(x.shape()[0], x.data<float>(), y.data<std::int32_t>(), net.storage_generation());
    return false;
  }
  /// end() with `net`'s generation now.
  template <class M>
  bool end_step(const M& net) {
    if constexpr (graph_model<M>) return end(net.storage_generation());
    return false;
  }
  /// Segment i of the step (device::step_graphs::segment).
  template <class F>
  void segment(std::size_t i, device::stream_t s, F&& work) {
    graphs_->segment(i, s, work);
  }
  /// The step's rate into the float the update reads, on `s` before the update's segment.
  void set_rate(device::stream_t s, float lr) {
    device::for_each_index(s, 1, write_rate{rate_.data<float>(), lr}, "ring_allreduce (the step's rate)");
  }
  /// Ends the step; true when it launched graphs (the segments' host code did not run).
  bool end(std::uint64_t generation) {
    graphs_->end(generation);
    return graphs_->launched();
  }

  /// The cache (its counts per batch rows).
  const device::step_graphs& graphs() const noexcept { return *graphs_; }

 private:
  bool on_ = false;
  tensor rate_;  // the step's rate, read by the update (device memory; host memory on CPU builds)
  std::unique_ptr<device::step_graphs> graphs_;  // two segments; held so that an engine can move
};

}  // namespace dtf::strategies::detail
