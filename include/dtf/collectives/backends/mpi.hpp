// dtf/collectives/backends/mpi.hpp — the collective backend on the user's MPI: allreduce,
// broadcast, allgather and barrier through MPI's own collectives, so they ride on the
// cluster's fabric and tuned algorithms instead of dtf's TCP ring.
//
//   MPI_Init(&argc, &argv);                                     // the user owns MPI's lifetime
//   dtf::mpi_communicator comm(dtf::mpi_backend(MPI_COMM_WORLD, {.timeout_ms = 30000}));
//   comm.allreduce("grads", grads.span<float>(), dtf::reduce_op::average);
//   ...
//   MPI_Finalize();                                             // after comm is destroyed
//
// Built only where MPI is found: CMake's find_package(MPI) defines DTF_HAVE_MPI on dtf::dtf
// and links MPI::MPI_CXX. Buffers are host memory (a CUDA-aware MPI is not assumed).
//
// Safety, as dtf's TCP ring: every collective first gathers every rank's 96-byte descriptor
// (sequence number, kind, tensor name, element count, dtype, op, root) with one
// MPI_Iallgather, and each rank checks all of them, so a mismatch fails every rank with
// errc::invalid_argument naming the first differing rank and both tensors, before any data
// moves. Errors name ranks as "rank K (MPI)".
//
// Failure: each collective is started non-blocking (MPI_Iallreduce, MPI_Ibcast,
// MPI_Iallgather) and polled with MPI_Test; a collective that has not completed within
// timeout_ms fails with errc::timeout. MPI cannot cancel a started collective nor say which
// rank is late, so the backend is then broken (every later call throws errc::peer_failure)
// and the program should end the job with MPI_Abort (abort_job()). A rank that dies is
// OpenMPI's business: mpirun notices the exit of a process that did not call MPI_Finalize and
// kills every other process of the job (exit status non-zero), usually well before timeout_ms.
//
// Communication volume is MPI's choice of algorithm, plus one allgather of n·96 bytes per
// collective for the descriptors.
//
// Thread safety: one thread at a time per backend; MPI must be initialised with at least
// MPI_THREAD_SERIALIZED if several threads use distinct backends.
#pragma once

#include <dtf/collectives.hpp>

#if !__has_include(<mpi.h>)
#error "dtf/collectives/backends/mpi.hpp needs MPI's <mpi.h>: link the dtf::mpi CMake target (defined where find_package(MPI) succeeds; apt-get install libopenmpi-dev openmpi-bin)"
#endif
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dtf {

/// Collective backend on an MPI communicator (see the file comment).
class mpi_backend {
 public:
  /// dtf::collective_backend: buffers in host memory.
  static constexpr buffer_memory memory = buffer_memory::host;

  /// Uses `comm` (not duplicated: dtf's collectives on it must not interleave with the
  /// user's own). MPI must be initialised. Only timeout_ms of `options` is used.
  /// Errors: errc::invalid_argument when MPI is not initialised.
  explicit mpi_backend(MPI_Comm comm = MPI_COMM_WORLD, collective_options options = {})
      : comm_(comm), options_(std::move(options)) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) throw error(errc::invalid_argument, "mpi_backend: MPI is not initialised (call MPI_Init first)");
    int r = 0, n = 0;
    check(MPI_Comm_rank(comm_, &r), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &n), "MPI_Comm_size");
    rank_ = std::size_t(r);
    size_ = std::size_t(n);
  }

  mpi_backend(const mpi_backend&) = delete;
  mpi_backend& operator=(const mpi_backend&) = delete;
  /// Movable (not copyable).
  ///@{
  mpi_backend(mpi_backend&&) noexcept = default;
  mpi_backend& operator=(mpi_backend&&) noexcept = default;
  ///@}

  /// This process's rank in the MPI communicator.
  std::size_t rank() const noexcept { return rank_; }
  /// The MPI communicator's size.
  std::size_t size() const noexcept { return size_; }
  /// The options given (only timeout_ms is used).
  const collective_options& options() const noexcept { return options_; }
  /// Collectives started so far.
  std::uint64_t sequence() const noexcept { return sequence_; }
  /// "rank r (MPI)": how errors name rank r.
  std::string describe(std::size_t r) const { return "rank " + std::to_string(r) + " (MPI)"; }
  /// The MPI communicator.
  MPI_Comm native_handle() const noexcept { return comm_; }

  /// Ends every process of the job (MPI_Abort): the way out after a timeout.
  [[noreturn]] void abort_job(int code = 1) const {
    MPI_Abort(comm_, code);
    std::abort();
  }

  /// dtf::collective_backend: in place, every rank's bytes reduced by `op`.
  void allreduce_bytes(std::string_view name, dtype type, std::span<std::byte> data, reduce_op op = reduce_op::sum) {
    run(detail::collective_kind::allreduce, name, type, data.size(), op, 0, [&] {
      const MPI_Datatype t = mpi_type(type);
      const MPI_Op mop = mpi_op(op);
      const std::size_t elem = size_of(type);
      // MPI counts are int: reduce INT_MAX-element pieces one after another.
      for (std::size_t at = 0; at < data.size();) {
        const std::size_t bytes = std::min(data.size() - at, std::size_t(INT_MAX) * elem);
        MPI_Request req;
        check(MPI_Iallreduce(MPI_IN_PLACE, data.data() + at, int(bytes / elem), t, mop, comm_, &req),
              "MPI_Iallreduce");
        wait(req, "allreduce of '" + std::string(name) + "'");
        at += bytes;
      }
      if (op == reduce_op::average && !data.empty()) detail::scale_for(type)(data.data(), data.size(), size_);
    });
  }

  /// dtf::collective_backend: in place, root's bytes everywhere.
  void broadcast_bytes(std::string_view name, dtype type, std::span<std::byte> bytes, std::size_t root) {
    if (root >= size_) throw error(errc::invalid_argument, "broadcast: root " + std::to_string(root));
    run(detail::collective_kind::broadcast, name, type, bytes.size(), reduce_op::sum, root, [&] {
      for (std::size_t at = 0; at < bytes.size();) {
        const std::size_t n = std::min(bytes.size() - at, std::size_t(INT_MAX));
        MPI_Request req;
        check(MPI_Ibcast(bytes.data() + at, int(n), MPI_BYTE, int(root), comm_, &req), "MPI_Ibcast");
        wait(req, "broadcast of '" + std::string(name) + "'");
        at += n;
      }
    });
  }

  /// dtf::collective_backend: `out` = every rank's `in`, in rank order.
  void allgather_bytes(std::string_view name, dtype type, std::span<const std::byte> in, std::span<std::byte> out) {
    if (out.size() != in.size() * size_)
      throw error(errc::shape_mismatch, "allgather of '" + std::string(name) + "': output of " +
                                            std::to_string(out.size()) + " bytes for " + std::to_string(size_) +
                                            " ranks of " + std::to_string(in.size()));
    if (in.size() > std::size_t(INT_MAX))
      throw error(errc::invalid_argument, "allgather of '" + std::string(name) + "': " + std::to_string(in.size()) +
                                              " bytes per rank exceeds MPI's int count");
    run(detail::collective_kind::allgather, name, type, in.size(), reduce_op::sum, 0, [&] {
      if (in.empty()) return;
      MPI_Request req;
      check(MPI_Iallgather(in.data(), int(in.size()), MPI_BYTE, out.data(), int(in.size()), MPI_BYTE, comm_, &req),
            "MPI_Iallgather");
      wait(req, "allgather of '" + std::string(name) + "'");
    });
  }

  /// The descriptor exchange is an allgather, which completes on a rank only once every rank
  /// has contributed: it is the barrier.
  void barrier() {
    run(detail::collective_kind::allreduce, "<barrier>", dtype::uint8, 0, reduce_op::sum, 0, [] {});
  }

 private:
  template <class F>
  void run(detail::collective_kind kind, std::string_view name, dtype type, std::size_t bytes, reduce_op op,
           std::size_t root, F&& body) {
    if (failed_) throw error(errc::peer_failure, "communicator failed earlier: " + *failed_);
    try {
      const auto d = detail::collective_descriptor::make(sequence_++, rank_, size_, kind, name, detail::fnv1a(name), type,
                                                         detail::elements_of(name, type, bytes), op, root);
      exchange_descriptors(d);
      body();
    } catch (const error& e) {
      failed_ = e.message();  // as dtf's TCP ring: after any error the backend is broken
      throw;
    }
  }

  void exchange_descriptors(const detail::collective_descriptor& mine) {
    const auto encoded = detail::encode_descriptor(mine, 0);
    all_headers_.resize(encoded.size() * size_);
    MPI_Request req;
    check(MPI_Iallgather(encoded.data(), int(encoded.size()), MPI_BYTE, all_headers_.data(), int(encoded.size()),
                         MPI_BYTE, comm_, &req),
          "MPI_Iallgather");
    wait(req, mine.describe() + ": descriptor exchange");
    for (std::size_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::span<const std::byte, detail::collective_header_size> theirs(
          all_headers_.data() + r * encoded.size(), detail::collective_header_size);
      detail::check_descriptor(mine, detail::decode_descriptor(theirs, describe(r)), describe(r));
    }
  }

  // Polls a started collective until it completes or timeout_ms passes.
  void wait(MPI_Request& req, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
    for (std::uint64_t spins = 0;; ++spins) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if ((spins & 255) == 0 && std::chrono::steady_clock::now() > deadline)
        throw error(errc::timeout, describe(rank_) + ": " + what + " did not complete within " +
                                       std::to_string(options_.timeout_ms) +
                                       " ms (a rank is late or stopped calling collectives; MPI does not say which)");
      std::this_thread::yield();
    }
  }

  static void check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw error(errc::peer_failure, std::string(call) + " failed: " + std::string(text, std::size_t(len)));
  }

  static MPI_Datatype mpi_type(dtype t) {
    switch (t) {
      case dtype::float32: return MPI_FLOAT;
      case dtype::float64: return MPI_DOUBLE;
      case dtype::int32: return MPI_INT32_T;
      case dtype::int64: return MPI_INT64_T;
      case dtype::uint8: return MPI_UINT8_T;
    }
    throw error(errc::invalid_argument, "mpi_backend: unknown dtype " + std::to_string(int(t)));
  }

  static MPI_Op mpi_op(reduce_op op) {
    switch (op) {
      case reduce_op::sum:
      case reduce_op::average: return MPI_SUM;
      case reduce_op::min: return MPI_MIN;
      case reduce_op::max: return MPI_MAX;
    }
    throw error(errc::invalid_argument, "mpi_backend: unknown reduce_op " + std::to_string(int(op)));
  }

  MPI_Comm comm_;
  collective_options options_;
  std::size_t rank_ = 0, size_ = 1;
  std::uint64_t sequence_ = 0;
  std::optional<std::string> failed_;
  std::vector<std::byte> all_headers_;
};

static_assert(collective_backend<mpi_backend>, "mpi_backend must model dtf::collective_backend");

/// The collectives API on the user's MPI.
using mpi_communicator = basic_communicator<mpi_backend>;

}  // namespace dtf
