// dtf/strategies/nccl_exchange.hpp — which backend a collective strategy's gradient buckets
// travel on, and the NCCL one: each bucket averaged in device memory on the communication
// stream once its gradients are written (docs/design/gpu-execution.md, section 6.1).
//
//   ring_allreduce_config c{.backend = dtf::strategies::exchange_backend::nccl};
//
// Selection (select_exchange, at the engine's construction): `automatic` is NCCL in a CUDA build
// linking dtf::nccl (DTF_HAVE_NCCL) when the exchange buffer is device memory on every rank, no
// two ranks share a GPU (NCCL refuses that: ncclInvalidUsage) and there is more than one rank;
// the TCP ring otherwise. The ranks decide together: each one's device (host name and PCI bus
// id) and memory kind are allgathered over the ring first, so they all take the same backend.
// `nccl` where it cannot be is errc::invalid_config naming the cause; `tcp` is the ring always.
//
// The NCCL exchange (nccl_bucket_exchange), on the engine's context's communication stream:
// reduce(k, bucket) is called by the bucket reducer (dtf/strategies/gradient_buckets.hpp) in
// order k = 0, 1, ..., on its communication thread with overlap, else on the training thread
// after backprop (and inside the step's capture in graph mode, section 7). Bucket k's allreduce
// waits on the device for the event section 6.0's rule 1 names (bucket_waits: the layer that
// completed it, noted from the model's ready callback, else gradients_written's event after the
// loss's slot), then ncclAllReduce with ncclAvg averages it in place: no host copy. finish()
// makes the compute stream (and, eagerly, the legacy stream) wait on the device for the last
// average: no host wait. Health (section 6.1): end_step() marks each step done on the compute
// stream; check_health(since) and wait(what) are called where the host waits anyway (the
// engine's readers, the loss ring's full-ring wait and drain, the engine's teardown) and fail by
// the progress rule (dtf/strategies/exchange_health.hpp) or on NCCL's error, aborting the
// communicator. The averages equal the ring's within float rounding (NCCL's order of summation
// is its own); every rank gets the same bits.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/collectives/nccl.hpp>
#include <dtf/config.hpp>
#include <dtf/device/context.hpp>
#include <dtf/error.hpp>
#include <dtf/strategies/exchange_health.hpp>
#include <dtf/strategies/gradient_buckets.hpp>
#include <dtf/strategies/pinned_staging.hpp>
#include <dtf/tensor.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>  // gethostname

namespace dtf::strategies {

/// The backend a collective strategy reduces its gradients on (see the file comment).
enum class exchange_backend {
  automatic,  ///< NCCL where it can be (CUDA build with dtf::nccl, device memory, a GPU per rank), else tcp
  tcp,        ///< dtf's TCP ring (through host memory on CUDA builds)
  nccl,       ///< NCCL on the device; errc::invalid_config at construction where it cannot be
};

/// "automatic", "tcp" or "nccl".
inline std::string_view name_of(exchange_backend b) noexcept {
  switch (b) {
    case exchange_backend::tcp: return "tcp";
    case exchange_backend::nccl: return "nccl";
    case exchange_backend::automatic: break;
  }
  return "automatic";
}

/// The backend named `s` (as name_of writes it). Errors: errc::invalid_argument naming `s`.
inline exchange_backend parse_exchange_backend(std::string_view s) {
  for (auto b : {exchange_backend::automatic, exchange_backend::tcp, exchange_backend::nccl})
    if (s == name_of(b)) return b;
  throw error(errc::invalid_argument,
              "exchange backend '" + std::string(s) + "': expected automatic, tcp or nccl");
}

namespace detail {

/// Whether this translation unit can reduce on NCCL (a CUDA build linking dtf::nccl).
#if DTF_CUDA && defined(DTF_HAVE_NCCL)
inline constexpr bool nccl_exchange_built = true;
#else
inline constexpr bool nccl_exchange_built = false;
#endif

/// A device-side exchange of gradient buckets (the engine reduces on its TCP ring without one).
class device_exchange {
 public:
  using clock = std::chrono::steady_clock;
  virtual ~device_exchange() = default;
  /// A new step (training thread): no bucket's gradients are noted yet.
  virtual void begin_step() = 0;
#if DTF_CUDA
  /// Floats [first, first + count) (buffer coordinates) are written once `event` completes
  /// (null: final on the host); from the model's ready callback, before the reducer hears of them.
  virtual void note(std::size_t first, std::size_t count, cudaEvent_t event) = 0;
#endif
  /// Every gradient and the loss's slot are issued (training thread, before the reducer's finish()).
  virtual void gradients_written() = 0;
  /// Bucket k's average over the ranks, in place, enqueued once its gradients are written.
  virtual void reduce(std::size_t k, const gradient_bucket& bucket) = 0;
  /// After the step's last bucket: the update's stream waits for the exchange on the device.
  virtual void finish() = 0;
  /// After the step's update (outside any graph): marks the step done for the health check.
  virtual void end_step() = 0;
  /// The buckets changed (the replan after the first step).
  virtual void set_buckets(std::vector<gradient_bucket> buckets) = 0;
  /// Throws (and aborts the exchange) when NCCL reports an error, or when no step completed for
  /// the bound since `since` (a host wait's start); never waits. `what` names the wait.
  virtual void check_health(clock::time_point since, const std::string& what) = 0;
  /// Waits for the work issued so far on the compute and communication streams, with
  /// check_health in the loop: the host may then wait for those streams without hanging.
  virtual void wait(const std::string& what) = 0;
  /// A failed step: ends the exchange's work in flight; the exchange is broken from then on.
  virtual void abort() noexcept = 0;
};

/// "bucket k of the gradients" for k < n: the buckets' names in errors, built once per plan.
inline std::vector<std::string> bucket_names(std::size_t n) {
  std::vector<std::string> names(n);
  for (std::size_t k = 0; k < n; ++k) names[k] = "bucket " + std::to_string(k) + " of the gradients";
  return names;
}

#if DTF_CUDA && defined(DTF_HAVE_NCCL)
/// The NCCL exchange of a buffer's buckets (see the file comment).
class nccl_bucket_exchange final : public device_exchange {
 public:
  /// Buckets of `buffer` (floats, device memory) over the ranks of `ring`; backprop writes the
  /// gradients on `compute` (and on the legacy stream for a model not bound to the context); the
  /// collectives run on `comm` (the context's communication stream).
  nccl_bucket_exchange(communicator& ring, float* buffer, std::vector<gradient_bucket> buckets, cudaStream_t compute,
                       cudaStream_t comm)
      : buffer_(buffer), compute_(compute), stream_(comm), nccl_(ring), names_(bucket_names(buckets.size())),
        waits_(std::move(buckets)),
        bound_(std::chrono::milliseconds(nccl_.timeout_ms())), marks_(64) {
    try {
      for (cudaEvent_t* e : {&written_, &legacy_written_, &done_, &probe_[0], &probe_[1]})
        check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      for (cudaEvent_t& e : marks_.events()) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    } catch (...) {
      release();
      throw;
    }
  }
  nccl_bucket_exchange(const nccl_bucket_exchange&) = delete;
  nccl_bucket_exchange& operator=(const nccl_bucket_exchange&) = delete;
  /// The streams' work is over or the communicator aborted (the engine's wait first); the
  /// communicator is then finalised (or aborted) by its own destructor.
  ~nccl_bucket_exchange() override { release(); }

  void begin_step() override { waits_.begin_step(); }
  void note(std::size_t first, std::size_t count, cudaEvent_t event) override { waits_.note(first, count, event); }
  void gradients_written() override {
    check(cudaStreamIsCapturing(compute_, &capture_), "cudaStreamIsCapturing");
    check(cudaEventRecord(written_, compute_), "cudaEventRecord (the step's gradients)");
    if (capture_ == cudaStreamCaptureStatusNone)  // a model not bound to the context writes there
      check(cudaEventRecord(legacy_written_, cudaStreamLegacy), "cudaEventRecord (the legacy stream)");
  }

  void reduce(std::size_t k, const gradient_bucket& b) override {
    const auto w = waits_.at(k);
    if (!w.reported) {
      check(cudaStreamWaitEvent(stream_, written_, 0), "cudaStreamWaitEvent (the step's gradients)");
      if (capture_ == cudaStreamCaptureStatusNone)
        check(cudaStreamWaitEvent(stream_, legacy_written_, 0), "cudaStreamWaitEvent (the legacy stream)");
    } else if (w.event) {
      check(cudaStreamWaitEvent(stream_, w.event, 0), "cudaStreamWaitEvent (a layer's gradient)");
    }
    nccl_.allreduce_average(buffer_ + b.begin, b.size(), stream_, names_.at(k));
  }

  void finish() override {
    check(cudaEventRecord(done_, stream_), "cudaEventRecord");
    check(cudaStreamWaitEvent(compute_, done_, 0), "cudaStreamWaitEvent (the update after the averages)");
    if (capture_ == cudaStreamCaptureStatusNone)  // the next step's writes by a model not bound to the context
      check(cudaStreamWaitEvent(cudaStreamLegacy, done_, 0), "cudaStreamWaitEvent (the legacy stream)");
  }

  void end_step() override {
    marks_.mark([&](cudaEvent_t& e) { check(cudaEventRecord(e, compute_), "cudaEventRecord (the step's end)"); });
  }

  void set_buckets(std::vector<gradient_bucket> buckets) override {
    names_ = bucket_names(buckets.size());
    waits_ = bucket_waits<cudaEvent_t>(std::move(buckets));
  }

  void check_health(clock::time_point since, const std::string& what) override {
    nccl_.check_health(what);
    bound_.observe(marks_.completed([](cudaEvent_t e) { return cudaEventQuery(e) == cudaSuccess; }), clock::now());
    if (bound_.expired(since, clock::now()))
      nccl_.fail_timeout(what + " (no step completed)", std::uint32_t(bound_.bound().count()));
  }

  void wait(const std::string& what) override {
    check(cudaEventRecord(probe_[0], compute_), "cudaEventRecord");
    check(cudaEventRecord(probe_[1], stream_), "cudaEventRecord");
    const auto since = clock::now();
    for (cudaEvent_t e : probe_)
      for (;;) {
        const cudaError_t q = cudaEventQuery(e);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
          nccl_.abort();
          throw error(errc::peer_failure, what + ": CUDA error: " + cudaGetErrorString(q));
        }
        check_health(since, what);
        std::this_thread::yield();
      }
  }

  void abort() noexcept override { nccl_.abort(); }

 private:
  static void check(cudaError_t rc, const char* call) {
    if (rc != cudaSuccess)
      throw error(errc::internal, std::string("nccl exchange: ") + call + ": " + cudaGetErrorString(rc));
  }
  void release() noexcept {
    for (cudaEvent_t e : {written_, legacy_written_, done_, probe_[0], probe_[1]})
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : marks_.events())
      if (e) cudaEventDestroy(e);
  }

  float* buffer_;
  cudaStream_t compute_, stream_;
  collectives::nccl_communicator nccl_;
  std::vector<std::string> names_;  // "bucket k of the gradients", built once (errors name them)
  bucket_waits<cudaEvent_t> waits_;  // rule 1 of section 6.0: what each bucket waits for
  progress_bound bound_;
  step_marks<cudaEvent_t> marks_;
  cudaStreamCaptureStatus capture_ = cudaStreamCaptureStatusNone;  // the step's, at gradients_written
  cudaEvent_t written_ = nullptr, legacy_written_ = nullptr, done_ = nullptr, probe_[2] = {nullptr, nullptr};
};

/// Whether every rank can take NCCL: an allgather over the ring of each rank's device (a hash
/// of its host name and PCI bus id) and whether `buffer` is device memory. Returns the empty
/// string when every rank can, else the reason (the same on every rank).
inline std::string nccl_refusal(communicator& ring, const void* buffer) {
  cudaPointerAttributes attr{};
  const bool on_device = cudaPointerGetAttributes(&attr, buffer) == cudaSuccess && attr.type == cudaMemoryTypeDevice;
  (void)cudaGetLastError();  // a host pointer may leave an error behind on old runtimes
  int device = 0;
  char bus[64] = {};
  char host[256] = {};
  std::string where = ::gethostname(host, sizeof host - 1) == 0 ? host : "?";
  if (cudaGetDevice(&device) == cudaSuccess && cudaDeviceGetPCIBusId(bus, sizeof bus, device) == cudaSuccess)
    where += std::string("/") + bus;
  else
    where += "/device " + std::to_string(device);
  const std::int64_t mine[2] = {std::int64_t(dtf::detail::fnv1a(where)), on_device ? 1 : 0};
  std::vector<std::int64_t> all(2 * ring.size());
  ring.allgather("<exchange backend: devices>", std::span<const std::int64_t>(mine, 2), std::span<std::int64_t>(all));
  for (std::size_t r = 0; r < ring.size(); ++r) {
    if (all[2 * r + 1] == 0) return ring.describe(r) + " has its gradients in host memory";
    for (std::size_t q = 0; q < r; ++q)
      if (all[2 * q] == all[2 * r])
        return ring.describe(q) + " and " + ring.describe(r) + " share a GPU (NCCL takes one rank per GPU)";
  }
  return {};
}
#endif

/// The exchange of an engine's buckets (null: the TCP ring), chosen as the file comment says;
/// `strategy` names the engine in errors; `ctx`: the engine's context (its compute stream writes
/// the buffer, the NCCL collectives run on its communication stream).
inline std::unique_ptr<device_exchange> select_exchange(exchange_backend backend, communicator& ring, tensor& buffer,
                                                        const std::vector<gradient_bucket>& buckets,
                                                        device::context& ctx, std::string_view strategy) {
  const std::string who(strategy);
  if (backend == exchange_backend::nccl && !nccl_exchange_built)
    throw error(errc::invalid_config,
                who + ": the nccl backend was asked for, but " +
                    (DTF_CUDA ? std::string("this CUDA build does not link dtf::nccl (NCCL not found, or the target "
                                            "does not link dtf::nccl: DTF_HAVE_NCCL is not defined)")
                              : std::string("this is a CPU build (NCCL needs -DDTF_CUDA=ON)")));
  if (backend == exchange_backend::tcp || ring.size() == 1) return nullptr;
#if DTF_CUDA && defined(DTF_HAVE_NCCL)
  if (const std::string why = nccl_refusal(ring, buffer.data<float>()); !why.empty()) {
    if (backend == exchange_backend::nccl) throw error(errc::invalid_config, who + ": the nccl backend: " + why);
    return nullptr;
  }
  return std::make_unique<nccl_bucket_exchange>(ring, buffer.data<float>(), buckets, ctx.compute_stream(),
                                                ctx.comm_stream());
#else
  (void)buffer;
  (void)buckets;
  (void)ctx;
  return nullptr;
#endif
}

}  // namespace detail
}  // namespace dtf::strategies
