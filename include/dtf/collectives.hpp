// dtf/collectives.hpp — allreduce, broadcast and allgather among the ranks of a ring, over
// TCP, without a parameter server (Horovod's scheme).
//
//   dtf::cluster c = dtf::resolve_cluster(flags);              // TF_CONFIG, flags, Slurm or mpirun
//   dtf::communicator comm = dtf::make_communicator(c, {.cluster_id = c.id(), .secret = s});
//   comm.broadcast("params", params.span<float>(), 0);         // rank 0's values everywhere
//   comm.allreduce("grads", grads.span<float>(), dtf::reduce_op::average);
//
// Ranks are the chief (if the cluster has a chief job) followed by the workers in index
// order; ps and evaluator tasks take no part. Each rank listens on its own address from the
// cluster spec (under mpirun, ranks meet at --rendezvous first, see make_communicator),
// connects once to its right neighbour and accepts its left neighbour, with the handshake of
// dtf/transport.hpp (protocol version, cluster id, identity, HMAC-SHA256 when a secret is
// set), and keeps both connections for the communicator's lifetime. With
// collective_options::tls every such connection (and the rendezvous) is TLS 1.3 from its first
// byte, keyed by the secret as the ps transport's (dtf/transport/tls.hpp): every byte between
// ranks is encrypted and authenticated, and a rank in the other mode is refused by name.
//
// Backends: dtf::communicator is basic_communicator<tcp_backend>, the API below over dtf's TCP
// ring. The same API runs over MPI (basic_communicator<mpi_backend>,
// dtf/collectives/backends/mpi.hpp, where MPI is found) and NCCL (basic_communicator<
// nccl_backend>, dtf/collectives/backends/nccl.hpp, CUDA builds; compiled, never yet run on a
// GPU); every backend models collective_backend and keeps the descriptor check below.
//
// Layout: this header declares and documents; dtf/collectives/dispatch.hpp picks the allreduce
// algorithm by world and message size; each algorithm has its own header in dtf/collectives/
// (two_rank, small_message, ring, recursive, broadcast, allgather, fusion); set-up (concurrent
// handshakes on a rank's port) is dtf/collectives/setup.hpp, the MPI rendezvous
// dtf/collectives/make_communicator.hpp.
//
// Algorithms and communication volume (n ranks, B bytes per rank):
//   allreduce, B > small_bytes: reduce-scatter then allgather around the ring, 2(n-1) steps;
//     each rank sends and receives 2(n-1)/n·B. Every chunk is split into segments of
//     segment_bytes, so a segment is forwarded as soon as it has been received and reduced.
//   allreduce, B <= small_bytes: every rank's buffer travels around the ring (n-1 steps,
//     (n-1)·B per rank), and every rank reduces in rank order: half the latency of the ring.
//   power-of-two worlds of 4+ ranks (hypercube option): recursive doubling up to
//     hypercube_small_bytes (log2(n) steps, log2(n)·B per rank), recursive halving then
//     doubling above (2·log2(n) steps, 2(n-1)/n·B per rank), over extra connections to the
//     partners rank XOR 2^k.
//   broadcast: a pipeline from the root around the ring, B per rank.
//   allgather: n-1 ring steps, (n-1)·B per rank.
// Results are bitwise identical on every rank (each element is reduced in one fixed order).
// The whole I/O runs on the calling thread with non-blocking sockets and poll().
//
// Safety: every collective sends a descriptor (sequence number, kind, tensor name, element
// count, dtype, op) ahead of its data; a rank that receives a descriptor that differs from its
// own fails with errc::invalid_argument naming the other rank and both tensors. A rank that
// dies or stops calling collectives makes every other rank fail (errc::peer_failure or
// errc::timeout, naming the neighbour) within timeout_ms: a failing rank closes its
// connections, so the failure travels around the ring. After any error the communicator is
// broken: every later call throws errc::peer_failure with the first error's message.
//
// Thread safety: a communicator serves one thread at a time; distinct communicators are
// independent. Every rank must call the same collectives in the same order.
#pragma once

#include <dtf/cluster.hpp>
#include <dtf/collectives/options.hpp>
#include <dtf/collectives/tcp_backend.hpp>
#include <dtf/config.hpp>
#include <dtf/detail/archive.hpp>
#include <dtf/detail/ring_acceptor.hpp>
#include <dtf/detail/ring_handshake.hpp>
#include <dtf/detail/ring_engine.hpp>
#include <dtf/detail/ring_schedule.hpp>
#include <dtf/detail/ring_socket.hpp>
#include <dtf/dtype.hpp>
#include <dtf/error.hpp>
#include <dtf/tensor.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace dtf {

/// What a collective backend provides (the policy of basic_communicator). Required expressions,
/// for `B& b`, `const B& cb`:
///   B::memory                              buffer_memory: where the byte spans below live
///   cb.rank(), cb.size()                   this rank and the world size (std::size_t)
///   cb.describe(r)                         "rank r (...)", the text errors name a rank by
///   cb.sequence()                          collectives started so far (std::uint64_t)
///   b.allreduce_bytes(name, type, bytes, op)      in place, every rank's bytes reduced by op
///   b.broadcast_bytes(name, type, bytes, root)    in place, root's bytes everywhere
///   b.allgather_bytes(name, type, in, out)        out = every rank's in, in rank order
///   b.barrier()
/// Each one exchanges dtf's collective descriptor first, so a mismatch fails every rank with
/// errc::invalid_argument naming the other rank and both tensors. Optional: b.allreduce_fused
/// (tensors, op) (else the communicator reduces tensor by tensor), b.options(), B::single(options).
template <class B>
concept collective_backend =
    std::move_constructible<B> &&
    requires(B& b, const B& cb, std::string_view name, dtype type, std::span<std::byte> bytes,
             std::span<const std::byte> in, reduce_op op, std::size_t r) {
      { B::memory } -> std::convertible_to<buffer_memory>;
      { cb.rank() } -> std::convertible_to<std::size_t>;
      { cb.size() } -> std::convertible_to<std::size_t>;
      { cb.describe(r) } -> std::convertible_to<std::string>;
      { cb.sequence() } -> std::convertible_to<std::uint64_t>;
      b.allreduce_bytes(name, type, bytes, op);
      b.broadcast_bytes(name, type, bytes, r);
      b.allgather_bytes(name, type, in, bytes);
      b.barrier();
    };

static_assert(collective_backend<tcp_backend>, "tcp_backend must model dtf::collective_backend");

/// The collectives API over a backend policy: tcp_backend (dtf's TCP ring, the default, named
/// dtf::communicator), mpi_backend (dtf/collectives/backends/mpi.hpp, on the user's MPI) or
/// nccl_backend (dtf/collectives/backends/nccl.hpp, device buffers on CUDA builds). Span
/// arguments live where Backend::memory says; tensor arguments are staged through host memory
/// when the backend wants host memory and the tensor lives on a device.
/// Thread safety: one thread at a time per communicator; every rank calls the same
/// collectives in the same order. Errors: see the file comment and the backend's header.
template <collective_backend Backend>
class basic_communicator {
 public:
  /// The backend policy.
  using backend_type = Backend;

  /// A communicator over `backend`.
  explicit basic_communicator(Backend backend) : backend_(std::move(backend)) {}

  /// dtf's TCP ring: see tcp_backend's constructor.
  basic_communicator(ring_listener listener, std::size_t rank, std::vector<std::string> addresses,
                     std::vector<std::string> names = {}, collective_options options = {})
    requires std::same_as<Backend, tcp_backend>
      : backend_(std::move(listener), rank, std::move(addresses), std::move(names), std::move(options)) {}

  /// The communicator of one process alone (size 1): every collective returns at once.
  static basic_communicator single(collective_options options = {})
    requires requires { Backend::single(std::move(options)); }
  {
    return basic_communicator(Backend::single(std::move(options)));
  }

  /// This process's rank.
  std::size_t rank() const noexcept { return backend_.rank(); }
  /// The number of ranks.
  std::size_t size() const noexcept { return backend_.size(); }
  /// "rank r (...)": how errors name rank r.
  std::string describe(std::size_t r) const { return backend_.describe(r); }
  /// Collectives completed (or started) on this communicator.
  std::uint64_t sequence() const noexcept { return backend_.sequence(); }
  /// The backend's options (backends that have them).
  decltype(auto) options() const
    requires requires(const Backend& b) { b.options(); }
  {
    return backend_.options();
  }
  /// The backend (e.g. its native handle).
  ///@{
  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }
  ///@}

  /// In place: data becomes op over every rank's data. All ranks pass the same name, size and
  /// element type.
  template <tensor_element T>
  void allreduce(std::string_view name, std::span<T> data, reduce_op op = reduce_op::sum) {
    backend_.allreduce_bytes(name, dtype_v<T>, std::as_writable_bytes(data), op);
  }

  /// allreduce on raw bytes of dtype `type`.
  void allreduce_bytes(std::string_view name, dtype type, std::span<std::byte> data, reduce_op op = reduce_op::sum) {
    backend_.allreduce_bytes(name, type, data, op);
  }

  /// In place: every rank's data becomes root's.
  template <tensor_element T>
  void broadcast(std::string_view name, std::span<T> data, std::size_t root = 0) {
    check_root(name, root);
    backend_.broadcast_bytes(name, dtype_v<T>, std::as_writable_bytes(data), root);
  }

  /// out[k*in.size() .. (k+1)*in.size()) = rank k's in, on every rank (out.size() must be
  /// size() * in.size()).
  template <tensor_element T>
  void allgather(std::string_view name, std::span<const T> in, std::span<T> out) {
    if (out.size() != in.size() * size())
      throw error(errc::shape_mismatch, "allgather of '" + std::string(name) + "': output of " +
                                            std::to_string(out.size()) + " elements for " + std::to_string(size()) +
                                            " ranks of " + std::to_string(in.size()));
    backend_.allgather_bytes(name, dtype_v<T>, std::as_bytes(in), std::as_writable_bytes(out));
  }

  /// Returns once every rank has called barrier().
  void barrier() { backend_.barrier(); }

  /// Fused allreduce of several tensors (any dtypes). With the TCP backend, consecutive
  /// tensors of one dtype are packed into one buffer of at most fusion_threshold_bytes,
  /// reduced together and unpacked; a backend without fusion reduces them one by one. Every
  /// rank passes the same list.
  void allreduce(std::span<const named_tensor> tensors, reduce_op op = reduce_op::sum) {
    if constexpr (requires { backend_.allreduce_fused(tensors, op); }) {
      backend_.allreduce_fused(tensors, op);
    } else {
      for (const auto& t : tensors) {
        if (!t.value) throw error(errc::invalid_argument, "allreduce: tensor '" + t.name + "' is null");
        allreduce(t.name, *t.value, op);
      }
    }
  }

  /// allreduce of one tensor (staged through host memory when the tensor is on a device and
  /// the backend wants host memory).
  void allreduce(std::string_view name, tensor& t, reduce_op op = reduce_op::sum) {
    if constexpr (requires { backend_.allreduce_fused(std::span<const named_tensor>{}, op); }) {
      named_tensor one{std::string(name), &t};
      backend_.allreduce_fused(std::span<const named_tensor>(&one, 1), op);
    } else if constexpr (direct_tensor_access) {
      backend_.allreduce_bytes(name, t.type(), t.bytes(), op);
    } else {
      std::vector<std::byte> host(t.size_bytes());
      detail::copy_tensor_to_host(t, host);
      backend_.allreduce_bytes(name, t.type(), host, op);
      detail::copy_tensor_from_host(host, t);
    }
  }

  /// broadcast of one tensor from root (staged like allreduce of a tensor).
  void broadcast(std::string_view name, tensor& t, std::size_t root = 0) {
    check_root(name, root);
    if constexpr (direct_tensor_access) {
      backend_.broadcast_bytes(name, t.type(), t.bytes(), root);
    } else {
      std::vector<std::byte> host(t.size_bytes());
      detail::copy_tensor_to_host(t, host);
      backend_.broadcast_bytes(name, t.type(), host, root);
      detail::copy_tensor_from_host(host, t);
    }
  }

 private:
  // A tensor's bytes go to the backend as they are when the backend reads the memory they
  // live in: host tensors to a host backend, device tensors (CUDA builds) to a device backend.
  static constexpr bool direct_tensor_access =
      (Backend::memory == buffer_memory::host) == device_memory_is_host_accessible;

  void check_root(std::string_view name, std::size_t root) const {
    if (root >= size())
      throw error(errc::invalid_argument, "broadcast of '" + std::string(name) + "': root " + std::to_string(root) +
                                              " of " + std::to_string(size()) + " ranks");
  }

  Backend backend_;
};

/// dtf's TCP ring: the communicator every strategy and example uses.
using communicator = basic_communicator<tcp_backend>;

/// Builds the communicator of the training tasks (chief, workers) of `c`; this process must be
/// one of them. Under mpirun (c.source == "mpi", addresses not known yet) the ranks first meet
/// at c.rendezvous: rank 0 listens there, every other rank listens on a free port and reports
/// it (with the address it reaches rank 0 from), and rank 0 sends everyone the table, which is
/// written into c.spec. The rendezvous uses the same handshake as the ring. Errors: those of
/// the communicator's constructor; errc::invalid_config when this task is not a training task.
communicator make_communicator(cluster& c, collective_options options = {});

}  // namespace dtf

// Bodies: set-up, the dispatch and one header per algorithm (Gloo's layout).
#include <dtf/collectives/allgather.hpp>
#include <dtf/collectives/broadcast.hpp>
#include <dtf/collectives/dispatch.hpp>
#include <dtf/collectives/fusion.hpp>
#include <dtf/collectives/make_communicator.hpp>
#include <dtf/collectives/recursive.hpp>
#include <dtf/collectives/ring.hpp>
#include <dtf/collectives/setup.hpp>
#include <dtf/collectives/small_message.hpp>
#include <dtf/collectives/two_rank.hpp>
