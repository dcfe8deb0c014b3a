// dtf/collectives/backends/nccl.hpp — the collective backend on NCCL, for device buffers on
// CUDA builds (Horovod's engine on GPUs).
//
//   dtf::communicator ring = dtf::make_communicator(c, opts);    // dtf's TCP ring: bootstrap
//   dtf::nccl_communicator comm(dtf::nccl_backend(std::move(ring)));
//   comm.allreduce("grads", grads, dtf::reduce_op::average);     // a device tensor, no host copy
//
// NOT YET RUN: this backend compiles in dtf's CUDA build (nvcc, DTF_CUDA with NCCL found,
// target dtf::nccl) but has never run on a GPU; no GPU was available while it was written.
//
// Bootstrap: the ranks of dtf's TCP ring (the communicator passed in, with its handshake and
// authentication) are NCCL's ranks; rank 0 creates the ncclUniqueId and broadcasts it over the
// ring. The ring then stays open and carries dtf's collective descriptor ahead of every NCCL
// collective (an allgather of the descriptors, so a mismatched name, count, dtype or op fails
// every rank with errc::invalid_argument naming the first differing rank and both tensors,
// before NCCL is called with inconsistent arguments, which would hang or corrupt memory).
//
// Failure: the NCCL communicator is non-blocking (ncclConfig_t::blocking = 0); every call is
// polled with ncclCommGetAsyncError and cudaStreamQuery against timeout_ms. When it has not
// completed by then, or NCCL reports an asynchronous error, the communicator is aborted
// (ncclCommAbort) and the call throws errc::timeout or errc::peer_failure; a dead rank fails
// the descriptor exchange on dtf's ring first (errc::peer_failure naming the neighbour). The
// backend is then broken: every later call throws errc::peer_failure.
//
// Buffers are device memory of the current CUDA device at construction. Thread safety: one
// thread at a time per backend.
#pragma once

#include <dtf/collectives.hpp>

#if !defined(DTF_CUDA) || !__has_include(<nccl.h>)
#error "dtf/collectives/backends/nccl.hpp needs a CUDA build (DTF_CUDA) and NCCL's <nccl.h>: link the dtf::nccl CMake target (defined in -DDTF_CUDA=ON builds where NCCL is found)"
#endif

#include <cuda_runtime.h>
#include <nccl.h>
#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtf {

namespace detail {
// reduce_op::average on integers: NCCL's ncclAvg is for floating types; dtf's integer average
// is the sum divided by the world size (integer division), as on the TCP ring.
struct divide_by_world {
  long long n;
  template <class T>
  __host__ __device__ T operator()(T v) const {
    return T(v / T(n));
  }
};
}  // namespace detail

/// Collective backend on NCCL (see the file comment).
class nccl_backend {
 public:
  /// dtf::collective_backend: buffers in device memory.
  static constexpr buffer_memory memory = buffer_memory::device;

  /// Builds the NCCL communicator of the ring's ranks on the current CUDA device. Errors:
  /// those of the ring (rank 0 unreachable), errc::timeout when NCCL's initialisation does not
  /// finish within the ring's timeout_ms, errc::peer_failure for an NCCL or CUDA error.
  explicit nccl_backend(tcp_backend ring) : ring_(std::move(ring)) {
    ncclUniqueId id{};
    if (ring_.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ring_.broadcast_bytes("<nccl unique id>", dtype::uint8,
                          std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, int(ring_.size()), id, int(ring_.rank()), &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      release();
      check(rc, "ncclCommInitRankConfig");
    }
    try {
      settle("ncclCommInitRankConfig");
    } catch (...) {
      release();
      throw;
    }
  }
  /// The same, from a communicator of dtf's TCP ring (taken over).
  explicit nccl_backend(communicator&& ring) : nccl_backend(std::move(ring.backend())) {}

  nccl_backend(const nccl_backend&) = delete;
  nccl_backend& operator=(const nccl_backend&) = delete;
  /// Movable (not copyable).
  nccl_backend(nccl_backend&& o) noexcept
      : ring_(std::move(o.ring_)), comm_(std::exchange(o.comm_, nullptr)), stream_(std::exchange(o.stream_, nullptr)),
        sequence_(o.sequence_), failed_(std::move(o.failed_)), headers_(std::move(o.headers_)) {}
  /// Move assignment.
  nccl_backend& operator=(nccl_backend&& o) noexcept {
    if (this != &o) {
      release();
      ring_ = std::move(o.ring_);
      comm_ = std::exchange(o.comm_, nullptr);
      stream_ = std::exchange(o.stream_, nullptr);
      sequence_ = o.sequence_;
      failed_ = std::move(o.failed_);
      headers_ = std::move(o.headers_);
    }
    return *this;
  }
  ~nccl_backend() { release(); }

  /// This process's rank.
  std::size_t rank() const noexcept { return ring_.rank(); }
  /// The number of ranks.
  std::size_t size() const noexcept { return ring_.size(); }
  /// The ring's options.
  const collective_options& options() const noexcept { return ring_.options(); }
  /// Collectives started so far.
  std::uint64_t sequence() const noexcept { return sequence_; }
  /// "rank r (...)": how errors name rank r.
  std::string describe(std::size_t r) const { return ring_.describe(r); }
  /// The NCCL communicator.
  ncclComm_t native_handle() const noexcept { return comm_; }
  /// The CUDA stream the collectives run on.
  cudaStream_t stream() const noexcept { return stream_; }

  /// In place on device memory.
  void allreduce_bytes(std::string_view name, dtype type, std::span<std::byte> data, reduce_op op = reduce_op::sum) {
    run(detail::collective_kind::allreduce, name, type, data.size(), op, 0, [&] {
      const std::size_t count = data.size() / size_of(type);
      const bool native_avg = op == reduce_op::average && (type == dtype::float32 || type == dtype::float64);
      const ncclRedOp_t nop = op == reduce_op::min   ? ncclMin
                              : op == reduce_op::max ? ncclMax
                              : native_avg           ? ncclAvg
                                                     : ncclSum;
      enqueue(ncclAllReduce(data.data(), data.data(), count, nccl_type(type), nop, comm_, stream_), "ncclAllReduce");
      complete("allreduce of '" + std::string(name) + "'");
      if (op == reduce_op::average && !native_avg && count) divide(type, data.data(), count);
    });
  }

  /// dtf::collective_backend: in place on device memory, root's bytes everywhere.
  void broadcast_bytes(std::string_view name, dtype type, std::span<std::byte> bytes, std::size_t root) {
    if (root >= size()) throw error(errc::invalid_argument, "broadcast: root " + std::to_string(root));
    run(detail::collective_kind::broadcast, name, type, bytes.size(), reduce_op::sum, root, [&] {
      enqueue(ncclBroadcast(bytes.data(), bytes.data(), bytes.size(), ncclUint8, int(root), comm_, stream_),
              "ncclBroadcast");
      complete("broadcast of '" + std::string(name) + "'");
    });
  }

  /// dtf::collective_backend: `out` = every rank's `in`, in rank order (device memory).
  void allgather_bytes(std::string_view name, dtype type, std::span<const std::byte> in, std::span<std::byte> out) {
    if (out.size() != in.size() * size())
      throw error(errc::shape_mismatch, "allgather of '" + std::string(name) + "': output of " +
                                            std::to_string(out.size()) + " bytes for " + std::to_string(size()) +
                                            " ranks of " + std::to_string(in.size()));
    run(detail::collective_kind::allgather, name, type, in.size(), reduce_op::sum, 0, [&] {
      enqueue(ncclAllGather(in.data(), out.data(), in.size(), ncclUint8, comm_, stream_), "ncclAllGather");
      complete("allgather of '" + std::string(name) + "'");
    });
  }

  /// The descriptor exchange over dtf's ring is an allgather: it is the barrier.
  void barrier() {
    run(detail::collective_kind::allreduce, "<barrier>", dtype::uint8, 0, reduce_op::sum, 0, [] {});
  }

 private:
  template <class F>
  void run(detail::collective_kind kind, std::string_view name, dtype type, std::size_t bytes, reduce_op op,
           std::size_t root, F&& body) {
    if (failed_) throw error(errc::peer_failure, "communicator failed earlier: " + *failed_);
    try {
      const auto d = detail::collective_descriptor::make(sequence_++, rank(), size(), kind, name, detail::fnv1a(name), type,
                                                         detail::elements_of(name, type, bytes), op, root);
      const auto mine = detail::encode_descriptor(d, 0);
      headers_.resize(mine.size() * size());
      ring_.allgather_bytes("<nccl descriptors>", dtype::uint8, mine, headers_);
      for (std::size_t r = 0; r < size(); ++r) {
        if (r == rank()) continue;
        const std::span<const std::byte, detail::collective_header_size> theirs(headers_.data() + r * mine.size(),
                                                                               detail::collective_header_size);
        detail::check_descriptor(d, detail::decode_descriptor(theirs, describe(r)), describe(r));
      }
      body();
    } catch (const error& e) {
      failed_ = e.message();
      abort_comm();
      throw;
    }
  }

  // A non-blocking communicator may answer ncclInProgress while it enqueues.
  void enqueue(ncclResult_t rc, const char* call) {
    if (rc != ncclSuccess && rc != ncclInProgress) check(rc, call);
    settle(call);
  }

  // Waits until the communicator is no longer in progress (initialisation, enqueue).
  void settle(const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options().timeout_ms);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check(state, what.c_str());
      if (std::chrono::steady_clock::now() > deadline) timed_out(what);
      std::this_thread::yield();
    }
  }

  // Waits for the stream, watching NCCL's asynchronous errors.
  void complete(const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options().timeout_ms);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, what.c_str());
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) check(state, what.c_str());
      if (std::chrono::steady_clock::now() > deadline) timed_out(what);
      std::this_thread::yield();
    }
  }

  [[noreturn]] void timed_out(const std::string& what) {
    throw error(errc::timeout, describe(rank()) + ": " + what + " did not complete within " +
                                   std::to_string(options().timeout_ms) + " ms; the NCCL communicator was aborted");
  }

  void divide(dtype type, std::byte* data, std::size_t count) {
    const detail::divide_by_world f{static_cast<long long>(size())};
    auto apply = [&](auto* p) { thrust::transform(thrust::cuda::par.on(stream_), p, p + count, p, f); };
    switch (type) {
      case dtype::int32: apply(reinterpret_cast<std::int32_t*>(data)); break;
      case dtype::int64: apply(reinterpret_cast<std::int64_t*>(data)); break;
      case dtype::uint8: apply(reinterpret_cast<std::uint8_t*>(data)); break;
      default: throw error(errc::invalid_argument, "nccl_backend: integer average of a floating dtype");
    }
    complete("average");
  }

  void abort_comm() noexcept {
    if (comm_) ncclCommAbort(std::exchange(comm_, nullptr));
  }

  // A healthy communicator is finalised (flushing its work) and destroyed; one that does not
  // finalise within timeout_ms is aborted.
  void release() noexcept {
    if (comm_) {
      ncclResult_t state = ncclCommFinalize(comm_);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ring_.options().timeout_ms);
      while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
        std::this_thread::yield();
      }
      if (state == ncclSuccess) ncclCommDestroy(std::exchange(comm_, nullptr));
      else abort_comm();
    }
    if (stream_) cudaStreamDestroy(std::exchange(stream_, nullptr));
  }

  static void check(ncclResult_t rc, const char* what) {
    if (rc == ncclSuccess) return;
    throw error(errc::peer_failure, std::string(what) + ": NCCL error: " + ncclGetErrorString(rc));
  }
  static void check_cuda(cudaError_t rc, const char* what) {
    if (rc == cudaSuccess) return;
    throw error(errc::peer_failure, std::string(what) + ": CUDA error: " + cudaGetErrorString(rc));
  }

  static ncclDataType_t nccl_type(dtype t) {
    switch (t) {
      case dtype::float32: return ncclFloat32;
      case dtype::float64: return ncclFloat64;
      case dtype::int32: return ncclInt32;
      case dtype::int64: return ncclInt64;
      case dtype::uint8: return ncclUint8;
    }
    throw error(errc::invalid_argument, "nccl_backend: unknown dtype " + std::to_string(int(t)));
  }

  tcp_backend ring_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::uint64_t sequence_ = 0;
  std::optional<std::string> failed_;
  std::vector<std::byte> headers_;
};

static_assert(collective_backend<nccl_backend>, "nccl_backend must model dtf::collective_backend");

/// The collectives API on NCCL, for device tensors.
using nccl_communicator = basic_communicator<nccl_backend>;

}  // namespace dtf
