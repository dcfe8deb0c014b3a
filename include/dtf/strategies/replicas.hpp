// dtf/strategies/replicas.hpp — the replicas of one process under dtf::strategies::mirrored
// (dtf/strategies/mirrored.hpp): a barrier that a failing replica breaks, one thread per
// replica running a step's work, and (CUDA builds linking dtf::nccl) the NCCL group that
// averages the replicas' gradients across their GPUs and broadcasts replica 0's.
//
// NOT YET RUN on GPUs: the NCCL group compiles in dtf's CUDA build, but no GPU was available
// while it was written.
#pragma once

#include <dtf/config.hpp>
#include <dtf/error.hpp>

#if DTF_CUDA
#include <dtf/detail/cuda_staging.hpp>  // detail::check_cuda

#include <cuda_runtime_api.h>
#endif
// The in-process NCCL reduction: in CUDA builds whose translation unit links dtf::nccl. The
// choice is a template argument of mirrored (below), so translation units that differ in it
// instantiate different types, not one type two ways.
#if DTF_CUDA && defined(DTF_HAVE_NCCL)
#include <nccl.h>
#define DTF_MIRRORED_NCCL 1
#else
/// 1 when mirrored reduces its replicas with NCCL (CUDA builds whose translation unit links
/// dtf::nccl), 0 otherwise: mirrored's default for its Nccl argument.
#define DTF_MIRRORED_NCCL 0
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtf::strategies {

namespace detail {

/// A reusable barrier for the replicas of one step that can be broken: once a replica fails,
/// every wait (current and later) throws instead of blocking forever.
class replica_barrier {
 public:
  explicit replica_barrier(std::size_t parties) : parties_(parties) {}

  void arrive_and_wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    if (broken_) throw error(errc::peer_failure, "mirrored: another replica failed");
    const std::uint64_t generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, timeout, [&] { return broken_ || generation_ != generation; })) {
      broken_ = true;
      cv_.notify_all();
      throw error(errc::timeout, "mirrored: a replica did not reach the synchronisation point within " +
                                     std::to_string(timeout.count()) + " ms");
    }
    if (generation_ == generation) throw error(errc::peer_failure, "mirrored: another replica failed");
  }

  void break_barrier() {
    std::lock_guard lock(m_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::size_t parties_, arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool broken_ = false;
};

/// The threads of replicas 1..R-1, started once and handed one job per step (replica 0 runs
/// on the caller's thread), so that thread start-up stays off the step path. `setup(k)` runs
/// once on thread k before its first job. A job must not throw (mirrored's catches everything).
class replica_threads {
 public:
  replica_threads(std::size_t replicas, std::function<void(std::size_t)> setup) {
    for (std::size_t k = 1; k < replicas; ++k)
      threads_.emplace_back([this, k, setup] {
        setup(k);
        loop(k);
      });
  }
  ~replica_threads() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
  }
  replica_threads(const replica_threads&) = delete;
  replica_threads& operator=(const replica_threads&) = delete;

  /// Runs j(k) on every replica thread and j(0) on this one; returns when all have.
  template <class Job>
  void run(const Job& j) {
    {
      std::lock_guard lock(m_);
      job_ = &j;
      call_ = [](const void* job, std::size_t k) { (*static_cast<const Job*>(job))(k); };
      pending_ = threads_.size();
      ++generation_;
    }
    start_.notify_all();
    j(0);
    std::unique_lock lock(m_);
    done_.wait(lock, [&] { return pending_ == 0; });  // each job is bounded by the replicas' timeouts
  }

 private:
  void loop(std::size_t k) {
    std::uint64_t seen = 0;
    while (true) {
      const void* j = nullptr;
      void (*call)(const void*, std::size_t) = nullptr;
      {
        std::unique_lock lock(m_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        j = job_;
        call = call_;
      }
      call(j, k);
      std::lock_guard lock(m_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex m_;
  std::condition_variable start_, done_;
  const void* job_ = nullptr;  // the current step's job and how to call it (no allocation per step)
  void (*call_)(const void*, std::size_t) = nullptr;
  std::size_t pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

/// The host path's stand-in for the NCCL group (mirrored<M, false>): nothing.
struct no_replica_group {};
class nccl_replica_group;

#if DTF_MIRRORED_NCCL
/// One NCCL communicator per replica GPU of this process (ncclCommInitAll), averaging a
/// buffer of equal size on each GPU in place, each on the stream its caller gives (mirrored:
/// the replica's communication stream, docs/design/gpu-execution.md, section 2.1). Driven from
/// one thread.
class nccl_replica_group {
 public:
  explicit nccl_replica_group(std::vector<int> devices) : devices_(std::move(devices)), comms_(devices_.size(), nullptr) {
    check(ncclCommInitAll(comms_.data(), int(devices_.size()), devices_.data()), "ncclCommInitAll");
  }
  nccl_replica_group(const nccl_replica_group&) = delete;
  nccl_replica_group& operator=(const nccl_replica_group&) = delete;
  ~nccl_replica_group() {
    for (auto& c : comms_)
      if (c) ncclCommDestroy(std::exchange(c, nullptr));
  }

  /// Issues buffers[k] (count floats on GPU devices[k]) := the mean of all of them, on
  /// streams[k] (of GPU devices[k]), as one NCCL group. Returns once issued: work on streams[k]
  /// after it sees the mean; the host does not wait. Errors: errc::internal naming the NCCL call.
  void average(std::span<float* const> buffers, std::span<const cudaStream_t> streams, std::size_t count) {
    if (buffers.size() != comms_.size() || streams.size() != comms_.size())
      throw error(errc::internal, "mirrored: " + std::to_string(buffers.size()) + " buffers and " +
                                      std::to_string(streams.size()) + " streams for " +
                                      std::to_string(comms_.size()) + " NCCL communicators");
    check(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    for (std::size_t k = 0; k < comms_.size() && first == ncclSuccess; ++k)
      first = ncclAllReduce(buffers[k], buffers[k], count, ncclFloat, ncclAvg, comms_[k], streams[k]);
    const ncclResult_t end = ncclGroupEnd();  // always closes the group
    check(first, "ncclAllReduce");
    check(end, "ncclGroupEnd");
  }

  /// Binds the buffers and streams of the calls below, once (no allocation per step). Errors:
  /// errc::internal when their counts are not the communicators'.
  void bind(std::vector<float*> buffers, std::vector<cudaStream_t> streams) {
    if (buffers.size() != comms_.size() || streams.size() != comms_.size())
      throw error(errc::internal, "mirrored: " + std::to_string(buffers.size()) + " buffers and " +
                                      std::to_string(streams.size()) + " streams for " +
                                      std::to_string(comms_.size()) + " NCCL communicators");
    buffers_ = std::move(buffers);
    streams_ = std::move(streams);
  }
  /// average(buffers, streams, count) on the bound ones.
  void average(std::size_t count) { average(buffers_, streams_, count); }
  /// Issues the bound buffers[k] := buffers[root] (count floats, in place), each on streams[k],
  /// as one NCCL group; the host does not wait (mirrored: the processes' mean from replica 0 to
  /// the others, docs/design/gpu-execution.md, section 2.1). Errors: errc::internal naming the
  /// NCCL call.
  void broadcast(std::size_t count, std::size_t root = 0) {
    if (buffers_.size() != comms_.size() || root >= comms_.size())
      throw error(errc::internal, "mirrored: NCCL broadcast from replica " + std::to_string(root) + " of " +
                                      std::to_string(comms_.size()) + " with " + std::to_string(buffers_.size()) +
                                      " bound buffers");
    check(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    for (std::size_t k = 0; k < comms_.size() && first == ncclSuccess; ++k)
      first = ncclBroadcast(buffers_[k], buffers_[k], count, ncclFloat, int(root), comms_[k], streams_[k]);
    const ncclResult_t end = ncclGroupEnd();  // always closes the group
    check(first, "ncclBroadcast");
    check(end, "ncclGroupEnd");
  }

 private:
  static void check(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess)
      throw error(errc::internal, std::string("mirrored: ") + what + " failed: " + ncclGetErrorString(rc) +
                                      " (ncclResult_t " + std::to_string(int(rc)) + ")");
  }

  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::vector<float*> buffers_;  // bind()'s
  std::vector<cudaStream_t> streams_;
};

/// The group of `replicas` replicas, replica k on GPU k, or null when they cannot each have a GPU
/// of their own (one replica, or more replicas than visible GPUs: mirrored's host path).
inline std::unique_ptr<nccl_replica_group> make_nccl_replica_group(std::size_t replicas) {
  int count = 0;
  if (replicas < 2 || cudaGetDeviceCount(&count) != cudaSuccess || std::size_t(count) < replicas) return nullptr;
  std::vector<int> devices(replicas);
  for (std::size_t k = 0; k < replicas; ++k) devices[k] = int(k);
  return std::make_unique<nccl_replica_group>(std::move(devices));
}

/// group.bind() to the replicas' gradient buffers and communication streams (mirrored's replicas:
/// each has `grads` and comm_stream()).
template <class Replicas>
void bind_replicas(nccl_replica_group& group, const Replicas& replicas) {
  std::vector<float*> buffers;
  std::vector<cudaStream_t> streams;
  for (const auto& r : replicas) {
    buffers.push_back(r->grads.template data<float>());
    streams.push_back(r->comm_stream());
  }
  group.bind(std::move(buffers), std::move(streams));
}
#endif

}  // namespace detail

}  // namespace dtf::strategies
