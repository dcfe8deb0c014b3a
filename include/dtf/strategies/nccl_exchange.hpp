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
// The NCCL exchange (nccl_bucket_exchange): reduce(k, bucket) is called by the bucket reducer
// (dtf/strategies/gradient_buckets.hpp) when bucket k's gradients are complete, on its
// communication thread with overlap. It records an event on the stream that wrote them (the
// engine's compute stream: the model's when bound, and the loss's slot; and the legacy stream,
// where a model not bound to the context writes), makes the communication stream
// wait for it and enqueues ncclAllReduce with ncclAvg there: no host copy. finish() makes the
// legacy stream wait for the communication stream and waits on the host, bounded, polling
// NCCL's errors (dtf/collectives/nccl.hpp), so the update, enqueued after it on the compute
// stream, reads the averages. The averages equal the ring's
// within float rounding (NCCL's order of summation is its own); every rank gets the same bits.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/collectives/nccl.hpp>
#include <dtf/config.hpp>
#include <dtf/error.hpp>
#include <dtf/strategies/gradient_buckets.hpp>
#include <dtf/tensor.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
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
  virtual ~device_exchange() = default;
  /// Bucket k's average over the ranks, in place, enqueued once its gradients are written.
  virtual void reduce(std::size_t k, const gradient_bucket& bucket) = 0;
  /// After the step's last bucket: the update's stream waits for the exchange (bounded).
  virtual void finish() = 0;
  /// A failed step: ends the exchange's work in flight; the exchange is broken from then on.
  virtual void abort() noexcept = 0;
};

#if DTF_CUDA && defined(DTF_HAVE_NCCL)
/// The NCCL exchange of a buffer's buckets (see the file comment).
class nccl_bucket_exchange final : public device_exchange {
 public:
  /// Buckets of `buffer` (floats, device memory) over the ranks of `ring`; `producer` gives the
  /// stream backprop writes the gradients on; `stream`: the communication stream (null: one of
  /// its own, non-blocking).
  nccl_bucket_exchange(communicator& ring, float* buffer, std::function<cudaStream_t()> producer,
                       cudaStream_t stream = nullptr)
      : buffer_(buffer), producer_(std::move(producer)), nccl_(ring) {
    if (!stream) {
      check(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      stream = own_;
    }
    stream_ = stream;
    for (cudaEvent_t* e : {&ready_, &legacy_ready_, &done_})
      check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  nccl_bucket_exchange(const nccl_bucket_exchange&) = delete;
  nccl_bucket_exchange& operator=(const nccl_bucket_exchange&) = delete;
  ~nccl_bucket_exchange() override {
    for (cudaEvent_t e : {ready_, legacy_ready_, done_})
      if (e) cudaEventDestroy(e);
    if (own_) cudaStreamDestroy(own_);
  }

  void reduce(std::size_t k, const gradient_bucket& b) override {
    const cudaStream_t from = producer_ ? producer_() : cudaStreamLegacy;
    check(cudaEventRecord(ready_, from), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    if (from != cudaStreamLegacy) {  // the loss slot is filled on the legacy stream
      check(cudaEventRecord(legacy_ready_, cudaStreamLegacy), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream_, legacy_ready_, 0), "cudaStreamWaitEvent");
    }
    nccl_.allreduce_average(buffer_ + b.begin, b.size(), stream_, "bucket " + std::to_string(k) + " of the gradients");
  }

  void finish() override {
    check(cudaEventRecord(done_, stream_), "cudaEventRecord");
    check(cudaStreamWaitEvent(cudaStreamLegacy, done_, 0), "cudaStreamWaitEvent");
    nccl_.wait(done_, "the gradients' allreduce");
  }

  void abort() noexcept override { nccl_.abort(); }

 private:
  static void check(cudaError_t rc, const char* call) {
    if (rc != cudaSuccess)
      throw error(errc::internal, std::string("nccl exchange: ") + call + ": " + cudaGetErrorString(rc));
  }

  float* buffer_;
  std::function<cudaStream_t()> producer_;
  collectives::nccl_communicator nccl_;
  cudaStream_t own_ = nullptr, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, legacy_ready_ = nullptr, done_ = nullptr;
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
/// `strategy` names the engine in errors; `writer()` gives the stream the engine writes the
/// buffer on (its compute stream: the model's when bound to the engine's context, and the loss's
/// slot), waited for besides the legacy stream (a model not bound writes there).
template <class M, class Writer>
std::unique_ptr<device_exchange> select_exchange(exchange_backend backend, communicator& ring, tensor& buffer, M& net,
                                                 std::string_view strategy, Writer writer) {
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
  (void)net;
  auto producer = [writer]() -> cudaStream_t {
    const cudaStream_t s = writer();
    return s ? s : cudaStreamLegacy;
  };
  return std::make_unique<nccl_bucket_exchange>(ring, buffer.data<float>(), producer);
#else
  (void)buffer;
  (void)net;
  (void)writer;
  return nullptr;
#endif
}

}  // namespace detail
}  // namespace dtf::strategies
