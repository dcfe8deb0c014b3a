// dtf/collectives/nccl.hpp — one NCCL communicator for a training engine, bootstrapped over the
// engine's dtf::communicator (docs/design/gpu-execution.md, section 6.1).
//
//   dtf::collectives::nccl_communicator nccl(comm);          // every rank of comm, at once
//   nccl.allreduce_average(grads, count, stream, "bucket 3"); // enqueued on `stream`
//   nccl.wait(done_event, "step 12");                        // bounded; aborts on a dead peer
//   nccl.check_health("a drain");                            // NCCL's async error, never waits
//
// Unlike dtf::nccl_communicator (basic_communicator<nccl_backend>,
// dtf/collectives/backends/nccl.hpp: the whole collectives API, which takes the TCP ring over),
// this borrows the ring for the bootstrap only and is a bare ncclComm_t for a strategy that
// enqueues its own collectives on its own stream and waits when it chooses.
//
// Bootstrap: rank 0 calls ncclGetUniqueId, share_nccl_id (dtf/collectives/nccl_bootstrap.hpp)
// sends it to the other ranks over the ring, every rank calls ncclCommInitRankConfig on the
// current CUDA device. The communicator is non-blocking (ncclConfig_t::blocking = 0): the
// initialisation and each enqueue are polled with ncclCommGetAsyncError for at most the ring's
// connect_timeout_ms (initialisation) or timeout_ms (the rest).
//
// Errors: every NCCL or CUDA failure is a dtf::error naming the call, the library's text
// (ncclGetErrorString, ncclGetLastError) and this rank as the ring names it; errc::timeout when a
// bounded wait runs out. A failure or a timeout aborts the communicator (ncclCommAbort, which
// also ends the kernels in flight: a peer's death ends the job with an error, not a hang); it
// is then broken and every later call throws errc::peer_failure with the first error.
//
// CUDA builds linking dtf::nccl only (DTF_CUDA and DTF_HAVE_NCCL); elsewhere this header
// declares nothing beyond the bootstrap. Thread safety: one thread at a time.
#pragma once

#include <dtf/collectives/nccl_bootstrap.hpp>

#if DTF_CUDA && defined(DTF_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>

namespace dtf::collectives {

static_assert(NCCL_UNIQUE_ID_BYTES == nccl_id_size, "dtf::collectives::nccl_id_size must be NCCL_UNIQUE_ID_BYTES");

/// The NCCL communicator of a dtf::communicator's ranks (see the file comment).
class nccl_communicator {
 public:
  /// Every rank of `ring` calls it at the same point of its collectives, with the CUDA device
  /// it trains on current. Errors: see the file comment (the ring's, then NCCL's).
  explicit nccl_communicator(communicator& ring)
      : rank_(ring.rank()), size_(ring.size()), me_(ring.describe(ring.rank())),
        timeout_ms_(ring.options().timeout_ms) {
    nccl_id_bytes bytes{};
    ncclUniqueId id{};
    if (rank_ == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::memcpy(bytes.data(), id.internal, nccl_id_size);
    }
    bytes = share_nccl_id(ring, bytes);
    std::memcpy(id.internal, bytes.data(), nccl_id_size);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, int(size_), id, int(rank_), &config);
    try {
      if (rc != ncclSuccess && rc != ncclInProgress) check(rc, "ncclCommInitRankConfig");
      settle("ncclCommInitRankConfig", std::max(timeout_ms_, ring.options().connect_timeout_ms));
    } catch (...) {
      abort();
      throw;
    }
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  /// A healthy communicator is finalised (its work flushed) within timeout_ms and destroyed; one
  /// that does not finalise in time, or failed, is aborted.
  ~nccl_communicator() {
    if (!comm_) return;
    ncclResult_t state = ncclCommFinalize(comm_);
    const auto deadline = clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (state == ncclInProgress && clock::now() < deadline) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      std::this_thread::yield();
    }
    if (state == ncclSuccess) ncclCommDestroy(std::exchange(comm_, nullptr));
    else abort();
  }

  /// This rank and the number of ranks (the ring's).
  std::size_t rank() const noexcept { return rank_; }
  std::size_t size() const noexcept { return size_; }
  /// The NCCL communicator (null once aborted).
  ncclComm_t native_handle() const noexcept { return comm_; }
  /// The first error, once the communicator has failed.
  const std::optional<std::string>& failure() const noexcept { return failed_; }

  /// Enqueues the average over the ranks of `count` floats at `data` (device memory, in place)
  /// on `stream` (ncclAllReduce with ncclAvg); `what` names it in errors. Does not wait for it.
  void allreduce_average(float* data, std::size_t count, cudaStream_t stream, const std::string& what) {
    guard([&] {
      const ncclResult_t rc = ncclAllReduce(data, data, count, ncclFloat32, ncclAvg, comm_, stream);
      // The names are built on failure only: this runs per bucket and step.
      if (rc != ncclSuccess && rc != ncclInProgress) check(rc, ("ncclAllReduce (" + what + ")").c_str());
      settle_call("ncclAllReduce", what, timeout_ms_);
    });
  }

  /// Waits until `done` (an event recorded after the collectives to wait for) has completed,
  /// polling NCCL's asynchronous errors, for at most timeout_ms (see the file comment).
  void wait(cudaEvent_t done, const std::string& what) {
    guard([&] {
      const auto deadline = clock::now() + std::chrono::milliseconds(timeout_ms_);
      for (;;) {
        const cudaError_t q = cudaEventQuery(done);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady)
          throw error(errc::peer_failure, me_ + ": " + what + ": CUDA error: " + cudaGetErrorString(q));
        poll(what);
        if (clock::now() > deadline) timed_out(what, timeout_ms_);
        std::this_thread::yield();
      }
    });
  }

  /// NCCL's asynchronous error, if any, as a dtf::error (the communicator is then aborted and
  /// broken); for a host that polls other conditions in its own wait loop.
  void check_health(const std::string& what) {
    guard([&] { poll(what); });
  }
  /// Ends a wait that saw no progress for `waited_ms`: errc::timeout naming `what`; the
  /// communicator is aborted and broken.
  [[noreturn]] void fail_timeout(const std::string& what, std::uint32_t waited_ms) {
    guard([&] { timed_out(what, waited_ms); });
    throw error(errc::internal, "unreachable");  // guard rethrows timed_out's error
  }
  /// The bound of this communicator's waits (the ring's timeout_ms).
  std::uint32_t timeout_ms() const noexcept { return timeout_ms_; }

  /// Aborts the communicator (idempotent): NCCL's kernels in flight end.
  void abort() noexcept {
    if (comm_) ncclCommAbort(std::exchange(comm_, nullptr));
  }

 private:
  using clock = std::chrono::steady_clock;

  // Runs one operation; any failure breaks the communicator (aborted, the first error kept).
  template <class F>
  void guard(F&& f) {
    if (failed_) throw error(errc::peer_failure, "NCCL communicator failed earlier: " + *failed_);
    try {
      f();
    } catch (const error& e) {
      failed_ = e.message();
      abort();
      throw;
    }
  }

  // Until the communicator is no longer in progress (initialisation, an enqueue).
  void settle(const std::string& what, std::uint32_t timeout_ms) {
    const auto deadline = clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check(state, what.c_str());
      if (clock::now() > deadline) timed_out(what, timeout_ms);
      std::this_thread::yield();
    }
  }

  // settle("call (what)"), the name built only when it fails.
  void settle_call(const char* call, const std::string& what, std::uint32_t timeout_ms) {
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (state != ncclSuccess) settle(std::string(call) + " (" + what + ")", timeout_ms);
  }

  // NCCL's asynchronous error, if any (a peer gone, a network failure).
  void poll(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress) check(state, what.c_str());
  }

  [[noreturn]] void timed_out(const std::string& what, std::uint32_t timeout_ms) const {
    throw error(errc::timeout, me_ + ": " + what + " did not complete within " + std::to_string(timeout_ms) +
                                   " ms (a rank dead or stalled?); the NCCL communicator was aborted");
  }

  void check(ncclResult_t rc, const char* call) const {
    if (rc == ncclSuccess) return;
    std::string text = me_ + ": " + call + ": NCCL error: " + ncclGetErrorString(rc) + " (ncclResult_t " +
                       std::to_string(int(rc)) + ")";
    if (const char* last = comm_ ? ncclGetLastError(comm_) : nullptr; last && *last) text += ": " + std::string(last);
    throw error(errc::peer_failure, text);
  }

  std::size_t rank_ = 0, size_ = 1;
  std::string me_;  // "rank 1 (worker:0 at host:2223)"
  std::uint32_t timeout_ms_ = 30000;
  ncclComm_t comm_ = nullptr;
  std::optional<std::string> failed_;
};

}  // namespace dtf::collectives

#endif  // DTF_CUDA && DTF_HAVE_NCCL
