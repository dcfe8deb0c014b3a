// dtf/device/step_graph.hpp — a training step captured as CUDA graphs once per batch size and
// replayed (docs/design/gpu-execution.md, section 7).
//
//   dtf::device::step_graphs graphs(2);                      // a step of two segments
//   graphs.begin(rows, x.data<float>(), y.data<std::int32_t>(), net.storage_generation());
//   graphs.segment(0, stream, [&] { ... the model's step ... });
//   ... work between the segments (values that change per step: kernel arguments) ...
//   graphs.segment(1, stream, [&] { ... the update ... });
//   graphs.end(net.storage_generation());
//   if (graphs.launched()) ... the host's bookkeeping of what the segments' code would have done ...
//
// The policy: graphs are keyed by the batch's rows (the full batch and an epoch's short last
// batch each get their own). A key's first step runs eagerly (workspaces and the pool fill:
// nothing may allocate under capture); its second is captured, segment by segment, on the
// segment's stream (cudaStreamBeginCapture, relaxed mode), instantiated once and launched; later
// steps launch the graphs (replays). A key's graphs are dropped when its batch moved (other data
// pointers at begin()); every graph is dropped by invalidate() and when the buffers' generation
// differs at begin() or end() (the owner's count of reallocations, e.g. a model's buffers that
// grew); a key whose graphs were dropped starts again with an eager step. Dropping graphs waits
// for the stream they were launched on (a host wait; never in a steady run).
// A segment's code runs on the host only when the step is eager or captured: a replay runs none
// of it (launched() says so), so per-step values must be written outside the segments (kernels
// with the value as an argument) and the host's bookkeeping kept by the caller.
// CPU builds: the same phases and counts (counts(rows)); every segment runs its code eagerly.
// Errors: a capture or launch that CUDA refuses is dtf::error(errc::internal) naming the call
// and the key (the segment's work did not run; the graphs are dropped).
// Thread safety: none; one thread (the engine's).
#pragma once

#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::device {

/// What a key's steps were.
struct graph_counts {
  std::uint64_t eager = 0;     ///< steps run eagerly (a key's first, and after a drop)
  std::uint64_t captures = 0;  ///< steps captured (and launched)
  std::uint64_t replays = 0;   ///< steps that launched the captured graphs
  /// Equal counts.
  friend bool operator==(const graph_counts&, const graph_counts&) = default;
};

/// The graphs of a step of `segments` segments, by batch rows (see the file comment).
class step_graphs {
 public:
  /// How the current step runs.
  enum class phase { eager, capture, replay };

  /// A cache for steps of `segments` segments (at least 1).
  explicit step_graphs(std::size_t segments) : segments_(segments) {
    if (segments == 0) throw error(errc::invalid_argument, "device::step_graphs: a step needs at least one segment");
  }
  step_graphs(const step_graphs&) = delete;
  step_graphs& operator=(const step_graphs&) = delete;
  ~step_graphs() { drop_all(); }

  /// Starts a step of `rows` rows whose batch is at `x`, `y`, over buffers of `generation`;
  /// returns how it runs.
  phase begin(std::size_t rows, const void* x, const void* y, std::uint64_t generation) {
    if (generation != generation_) {
      drop_all();
      generation_ = generation;
    }
    entry& e = entries_[rows];
    if (e.x != x || e.y != y) {
      drop(e);
      e.x = x;
      e.y = y;
    }
    current_ = &e;
    rows_ = rows;
    phase_ = !e.warmed ? phase::eager : !e.captured ? phase::capture : phase::replay;
    next_ = 0;
    return phase_;
  }

  /// Runs segment `i` (in order, each once per step) of the current step on `s`: `work()` issues
  /// it eagerly, or under capture, or the segment's graph is launched (work is not called).
  template <class F>
  void segment(std::size_t i, stream_t s, F&& work) {
    if (!current_ || i != next_ || i >= segments_)
      throw error(errc::internal, "device::step_graphs: segment " + std::to_string(i) + " out of order");
    ++next_;
#if DTF_CUDA
    stream_ = s;
    if (phase_ == phase::replay) return launch(current_->graphs[i], s);
    if (phase_ == phase::capture) return capture(i, s, work);
#else
    (void)s;
#endif
    work();
  }

  /// The current step's segments have all run; `generation`: the buffers' generation now (an
  /// eager step may have grown them: every other key's graphs are then dropped).
  void end(std::uint64_t generation) {
    if (!current_) return;
    if (next_ != segments_) throw error(errc::internal, "device::step_graphs: a step ended before its last segment");
    entry& e = *current_;
    current_ = nullptr;
    if (phase_ == phase::eager) {
      e.warmed = true;
      ++e.counts.eager;
    } else if (phase_ == phase::capture) {
      e.captured = true;
      ++e.counts.captures;
    } else {
      ++e.counts.replays;
    }
    if (generation != generation_) {
      drop_all();
      generation_ = generation;
      if (phase_ == phase::eager) e.warmed = true;  // it ran on the new buffers: its next step captures
    }
  }

  /// Whether the current (or last) step launched graphs instead of running the segments' code
  /// (a replay on a CUDA build).
  bool launched() const noexcept { return DTF_CUDA && phase_ == phase::replay; }
  /// The current (or last) step's phase.
  phase current_phase() const noexcept { return phase_; }

  /// Drops every graph (something captured changed: a restore, a re-bind, buffers reallocated);
  /// each key starts again with an eager step.
  void invalidate() { drop_all(); }

  /// The steps of batch `rows` so far.
  graph_counts counts(std::size_t rows) const {
    const auto it = entries_.find(rows);
    return it == entries_.end() ? graph_counts{} : it->second.counts;
  }
  /// The keys that hold graphs now.
  std::size_t captured_keys() const noexcept {
    std::size_t k = 0;
    for (const auto& [rows, e] : entries_) k += e.captured ? 1 : 0;
    return k;
  }

 private:
#if DTF_CUDA
  using exec_t = cudaGraphExec_t;
#else
  using exec_t = void*;
#endif
  struct entry {
    const void* x = nullptr;
    const void* y = nullptr;
    bool warmed = false;    // its eager step ran (with the buffers of generation_)
    bool captured = false;  // graphs holds every segment's
    std::vector<exec_t> graphs;
    graph_counts counts;
  };

  // Drops a key's graphs: it is no longer warm (its next step is eager).
  void drop(entry& e) {
#if DTF_CUDA
    if (!e.graphs.empty()) {
      cudaStreamSynchronize(stream_);  // a launch may still run
      for (exec_t g : e.graphs)
        if (g) cudaGraphExecDestroy(g);
    }
#endif
    e.graphs.clear();
    e.captured = false;
    e.warmed = false;
  }
  void drop_all() {
    for (auto& [rows, e] : entries_) drop(e);
  }

#if DTF_CUDA
  void fail(cudaError_t rc, const char* what) {
    throw error(errc::internal, std::string("device::step_graphs: ") + what + " (the step of " + std::to_string(rows_) +
                                    " rows; --nocuda_graph runs it eagerly): " + cudaGetErrorString(rc));
  }
  template <class F>
  void capture(std::size_t i, cudaStream_t s, F& work) {
    entry& e = *current_;
    if (i == 0) e.graphs.assign(segments_, nullptr);
    if (const cudaError_t rc = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed); rc != cudaSuccess) {
      abandon();
      fail(rc, "cudaStreamBeginCapture");
    }
    try {
      work();
    } catch (...) {
      cudaGraph_t g = nullptr;
      if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
      abandon();
      throw;
    }
    cudaGraph_t g = nullptr;
    cudaError_t rc = cudaStreamEndCapture(s, &g);
    if (rc == cudaSuccess) rc = cudaGraphInstantiate(&e.graphs[i], g, 0);
    if (g) cudaGraphDestroy(g);
    if (rc != cudaSuccess) {
      abandon();
      fail(rc, "capturing the step in a CUDA graph");
    }
    launch(e.graphs[i], s);
  }
  void launch(exec_t g, cudaStream_t s) {
    if (const cudaError_t rc = cudaGraphLaunch(g, s); rc != cudaSuccess) {
      abandon();
      fail(rc, "cudaGraphLaunch");
    }
  }
  // The current step failed: its key's graphs go, the step is over.
  void abandon() {
    if (current_) drop(*current_);
    current_ = nullptr;
  }
#endif

  std::size_t segments_;
  std::map<std::size_t, entry> entries_;
  entry* current_ = nullptr;
  std::size_t rows_ = 0, next_ = 0;
  phase phase_ = phase::eager;
  std::uint64_t generation_ = 0;
#if DTF_CUDA
  cudaStream_t stream_{};
#endif
};

}  // namespace dtf::device
