// dtf/strategies/engine_context.hpp — a collective engine's device::context
// (docs/design/gpu-execution.md, section 2): created with the engine on the current device,
// handed to the model when the model takes one (detail::takes_context, e.g. nn::sequential) and
// taken back when the engine goes; the engine issues its own work (the exchange buffer's prefix,
// the update) on the same compute stream, so a step is ordered on one stream.
//
//   detail::engine_context<M> ctx(net);        // net.set_context(ctx.get()) when M takes one
//   ctx.bind();                                 // each step: still bound (another engine may have taken it)
//   optimizer.set_stream(ctx.stream());         // the update on the compute stream
//   ctx.write_prefix(g, 16, net.device_loss(), 0.0f);  // [loss, 15 zeros] on the compute stream
//   ctx.set_wait_guard([&](auto& what) { exchange.wait(what); });  // NCCL: waits that cannot hang
//   ctx.settle();                               // the host waits (a read at a hook's cadence)
//
// CUDA builds: the context's compute stream is non-blocking, so work on the legacy default stream
// (Thrust's blocking calls, synchronous copies) is not ordered after it: whoever reads the
// engine's buffers from the host or the legacy stream calls settle() first (the engine's
// accessors do). CPU builds: the context's CPU twin; every call has completed when it returns,
// settle() does nothing, and the prefix is written with the same values as before the context.
// Thread safety: one thread (the engine's).
#pragma once

#include <dtf/config.hpp>
#include <dtf/device/context.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::strategies::detail {

/// A model whose step can run on a device::context (nn::sequential): bound with set_context(ctx),
/// asked with context(), unbound with clear_context().
template <class M>
concept takes_context = requires(M& m, const M& cm, device::context& c) {
  m.set_context(c);
  m.clear_context();
  { cm.context() } -> std::convertible_to<const device::context*>;
};

/// One thread: the exchange buffer's prefix, the loss in slot 0 (read from `loss` when it is not
/// null, else `value`) and zeros after it.
struct write_prefix_at {
  float* g;
  const float* loss;
  float value;
  DTF_HD void operator()(std::size_t i) const { g[i] = i == 0 ? (loss ? *loss : value) : 0.0f; }
};

/// Sets, on another thread (a communication thread), the device current here (CUDA builds; empty
/// on CPU builds or when CUDA cannot say).
inline std::function<void()> current_device_setter() {
#if DTF_CUDA
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return {};
  return [device] { cudaSetDevice(device); };
#else
  return {};
#endif
}

/// The context of one engine over model M (see the file comment).
template <class M>
class engine_context {
 public:
  /// A context on the current device, bound to `net` when M takes one.
  explicit engine_context(M& net) : ctx_(std::make_unique<device::context>()), net_(&net) {
    if constexpr (takes_context<M>) net.set_context(*ctx_);
  }
  engine_context(engine_context&&) noexcept = default;  // the moved-from one holds no context
  engine_context& operator=(engine_context&&) = delete;
  /// Unbinds the model if it still runs on this context; the context then drains its streams.
  ~engine_context() {
    if constexpr (takes_context<M>)
      if (ctx_ && net_->context() == ctx_.get()) net_->clear_context();
  }

  /// Binds the model again if something else bound it since (another engine over the same model,
  /// which unbinds it when it goes): the model's work must be on the stream the update follows.
  void bind() const {
    if constexpr (takes_context<M>)
      if (net_->context() != ctx_.get()) net_->set_context(*ctx_);
  }

  /// The context.
  device::context& get() const noexcept { return *ctx_; }
  /// The compute stream (CUDA builds; a placeholder on CPU builds).
  device::stream_t stream() const noexcept {
#if DTF_CUDA
    return ctx_->compute_stream();
#else
    return {};
#endif
  }
  /// What the host calls before each of its waits for the context's streams (settle(), read(),
  /// guard()): a device exchange's bounded, health-checked wait (section 6.1), so the waits
  /// cannot hang on a dead peer's collective; empty: none.
  void set_wait_guard(std::function<void(const std::string& what)> g) { guard_ = std::move(g); }
  /// Runs the wait guard (a host read outside settle() and read(), e.g. a device scalar's).
  void guard(const std::string& what) const {
    if (guard_) guard_(what);
  }
  /// The host waits for the work issued on the context so far (no-op on CPU builds).
  void settle() const {
    guard("a host read of the engine's buffers");
    ctx_->synchronize();
  }

  /// Writes g[0] = *loss (or `value` when loss is null) and g[1..prefix) = 0 on the compute stream.
  void write_prefix(float* g, std::size_t prefix, const float* loss, float value) const {
    device::for_each_index(stream(), prefix, write_prefix_at{g, loss, value}, "ring_allreduce (the loss's slot)");
  }

  /// The float at `p` (device memory; host memory on CPU builds) once the compute stream's work
  /// so far has written it: the host waits for the compute stream.
  float read(const float* p) const {
#if DTF_CUDA
    guard("the step's loss read");
    float v = 0.0f;
    cudaError_t rc = cudaMemcpyAsync(&v, p, sizeof v, cudaMemcpyDeviceToHost, stream());
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream());
    if (rc != cudaSuccess) throw error(errc::internal, std::string("ring_allreduce: reading the loss: ") + cudaGetErrorString(rc));
    return v;
#else
    return *p;
#endif
  }

 private:
  std::unique_ptr<device::context> ctx_;
  M* net_;
  std::function<void(const std::string&)> guard_;  // set_wait_guard
};

}  // namespace dtf::strategies::detail
