// dtf/strategies/mirrored_replicas.hpp — one replica of dtf::strategies::mirrored
// (dtf/strategies/mirrored.hpp) and its execution context (docs/design/gpu-execution.md,
// section 2.1): the replica's copy of the model, its variables, gradient and optimiser, and a
// device::context created on the replica's device, bound to the model when the model takes one
// (detail::takes_context, as ring_allreduce's engine does), the update issued on its compute
// stream.
//
//   detail::mirrored_replica<M> rep(prototype, n, rule, passes);  // on replica k's device
//   rep.set_batch(batch);                // the batch in through pinned slots, compute stream
//   ... loss = rep.net.loss_and_gradients(...) ...
//   rep.write_prefix(loss);              // [loss, 15 zeros] before the gradient, compute stream
//   rep.comm_after_compute();            // the communication stream waits for it (NCCL path)
//   rep.compute_after_comm();            // the compute stream waits for the average (NCCL path)
//   rep.opt.apply(...);                  // on the compute stream
//
// CUDA builds: the compute and communication streams are the context's (non-blocking), so work
// on the legacy stream is not ordered after them: whoever reads the replica's buffers from the
// host or the legacy stream calls settle() first. The host path's trips through host memory are
// cudaMemcpyAsync on the compute stream to and from pinned buffers allocated once, the host
// waiting only where it reads the bytes (gradients_to_host). The batch goes in the same way
// (device::batch_upload, section 3.1): no host wait per step, so the host's next write to a
// buffer an asynchronous copy reads is ordered by another wait (see mean_to_device).
// CPU builds: the context's CPU twin; every call has completed when it returns and the
// arithmetic is the one before the context, bit for bit (the batch: assign_from_host's bits).
// Thread safety: one thread per replica (its own), except where mirrored says otherwise.
#pragma once

#include <dtf/config.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/device/batch_upload.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>
#include <dtf/host.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/strategies/engine_context.hpp>
#include <dtf/strategies/gradient_buckets.hpp>
#include <dtf/strategies/micro_batches.hpp>
#include <dtf/strategies/mirrored_staging.hpp>  // pinned_floats
#include <dtf/tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#if DTF_CUDA
#include <dtf/detail/cuda_staging.hpp>  // dtf::detail::check_cuda

#include <dtf/optim/device_clip.hpp>

#include <cuda_runtime.h>
#endif

namespace dtf::strategies::detail {

#if DTF_CUDA
/// An event (no timing) on the current device, destroyed with its owner.
class replica_event {
 public:
  replica_event() { dtf::detail::check_cuda(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreateWithFlags"); }
  replica_event(const replica_event&) = delete;
  replica_event& operator=(const replica_event&) = delete;
  ~replica_event() {
    if (e_) cudaEventDestroy(e_);
  }
  cudaEvent_t get() const noexcept { return e_; }

 private:
  cudaEvent_t e_{};
};
#endif

/// One replica of mirrored over model M (see the file comment). Built on the replica's device.
template <class M>
struct mirrored_replica {
  static constexpr std::size_t pre = exchange_prefix;

  /// host_path: the host averages the replicas (CUDA builds: host_grads is allocated, pinned).
  mirrored_replica(const M& prototype, std::size_t n, const optim::rule& rule, int passes, bool host_path = true)
      : net(prototype), params({n}), grads({pre + n}),
        host_grads(device_memory_is_host_accessible || !host_path ? 0 : pre + n),
        opt(rule, n), micro(passes), exec(net) {
    opt.set_stream(exec.stream());  // the update after the model's step, on one stream
  }
  mirrored_replica(const mirrored_replica&) = delete;
  mirrored_replica& operator=(const mirrored_replica&) = delete;

  M net;
  tensor params, grads, x, y;  // grads: [loss, 15 zeros, the gradient]
  pinned_floats host_grads;    // CUDA builds: grads staged in pinned host memory (the host path)
  optim::optimizer<> opt;
  micro_batches micro;      // backward_passes_per_step
  dtf::device::batch_upload upload;  // set_batch's pinned slots (before exec: freed after it drains)
  engine_context<M> exec;  // after net: it unbinds the model before the model goes
#if DTF_CUDA
  replica_event ready;  // recorded on the compute stream after the loss's slot (the NCCL path)
  optim::device_clip clip;  // clip_norm on the compute stream (the NCCL path)
#endif

  /// The host waits for the work issued on the replica's streams so far (no-op on CPU builds).
  void settle() const { exec.settle(); }

  /// Binds the model again if something else bound it since, then copies the batch in through
  /// pinned slots (device::batch_upload) on the stream the model reads it on: the compute
  /// stream, after the previous step's reads of x and y (stream order), with no host wait unless
  /// a tensor grows past its allocation (then settle(): Thrust reallocates on the legacy stream). A model that
  /// takes no context runs on the legacy stream, which is not ordered after the previous update
  /// on the compute stream: the host waits for it first, as before.
  void set_batch(const data::host_batch& b) {
    exec.bind();
    if constexpr (!takes_context<M>) settle();
    upload.upload(x, b.features, y, b.labels, takes_context<M> ? exec.stream() : dtf::device::stream_t{},
                  [this] { settle(); });
  }

  /// grads[0] = loss, grads[1..pre) = 0: on CPU builds in place, on CUDA builds one kernel on
  /// the compute stream.
  void write_prefix(float loss) {
#if DTF_CUDA
    dtf::device::for_each_index(exec.stream(), pre, write_prefix_at{grads.template data<float>(), nullptr, loss},
                           "mirrored (the loss's slot)");
#else
    float* g = grads.template data<float>();
    std::fill(g, g + pre, 0.0f);
    g[0] = loss;
#endif
  }

  /// The communication stream waits (on the device) for the compute stream's work so far.
  void comm_after_compute() {
#if DTF_CUDA
    dtf::detail::check_cuda(cudaEventRecord(ready.get(), exec.stream()), "cudaEventRecord (mirrored gradients)");
    dtf::detail::check_cuda(cudaStreamWaitEvent(exec.get().comm_stream(), ready.get(), 0),
                            "cudaStreamWaitEvent (mirrored gradients)");
#endif
  }
  /// The compute stream waits (on the device) for the communication stream's work so far.
  void compute_after_comm() { exec.get().compute_waits_for_comm(); }

#if DTF_CUDA
  /// The communication stream (CUDA builds).
  cudaStream_t comm_stream() const noexcept { return exec.get().comm_stream(); }

  /// host_grads[0..pre) = [loss, zeros], host_grads[pre..) = the gradient, once the compute
  /// stream wrote it: the host waits (it averages the replicas on the host path).
  void gradients_to_host(float loss) {
    const std::size_t n = host_grads.size() - pre;
    dtf::detail::check_cuda(cudaMemcpyAsync(host_grads.data() + pre, grads.template data<float>() + pre, n * sizeof(float),
                                            cudaMemcpyDeviceToHost, exec.stream()),
                            "cudaMemcpyAsync (mirrored gradients to the host)");
    dtf::detail::check_cuda(cudaStreamSynchronize(exec.stream()), "cudaStreamSynchronize (mirrored gradients)");
    std::fill(host_grads.data(), host_grads.data() + pre, 0.0f);
    host_grads[0] = loss;
  }
  /// The gradient := `mean` (n floats of pinned host memory), on the compute stream, with no host
  /// wait: the caller does not write `mean` again before this copy completed (mirrored's host
  /// path: the next write follows the next step's first barrier, which every replica reaches
  /// after gradients_to_host's cudaStreamSynchronize of the compute stream, stream-ordered
  /// after this copy; set_batch no longer waits). A step that fails before that barrier breaks
  /// it, so no replica writes `mean` in that step.
  void mean_to_device(const float* mean, std::size_t n) {
    dtf::detail::check_cuda(cudaMemcpyAsync(grads.template data<float>() + pre, mean, n * sizeof(float),
                                            cudaMemcpyHostToDevice, exec.stream()),
                            "cudaMemcpyAsync (mirrored mean to the device)");
  }
#endif
};


/// out[i] = the replicas' mean of floats i in [begin, end) of [loss, zeros, gradient] (their
/// host gradients: in place on CPU builds, host_grads on CUDA builds), in the same order whoever
/// computes it (mirrored's replicas by slices, or its communication thread by buckets).
template <class M>
void average_replicas(const std::vector<std::unique_ptr<mirrored_replica<M>>>& replicas, float* out, std::size_t begin,
                      std::size_t end) {
  const auto host = [&](std::size_t k) -> const float* {
    if constexpr (device_memory_is_host_accessible)
      return replicas[k]->grads.template data<float>();
    else
      return replicas[k]->host_grads.data();
  };
  const float inv = 1.0f / float(replicas.size());
  const float* first = host(0);
  for (std::size_t i = begin; i < end; ++i) out[i] = first[i];
  for (std::size_t j = 1; j < replicas.size(); ++j) {
    const float* g = host(j);
    for (std::size_t i = begin; i < end; ++i) out[i] += g[i];
  }
  for (std::size_t i = begin; i < end; ++i) out[i] *= inv;
}

}  // namespace dtf::strategies::detail
