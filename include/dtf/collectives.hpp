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
// set), and keeps both connections for the communicator's lifetime.
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
#include <dtf/config.hpp>
#include <dtf/detail/archive.hpp>
#include <dtf/detail/ring_acceptor.hpp>
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

/// Knobs of a communicator. Every rank must use the same small_bytes, hypercube_small_bytes
/// and hypercube (a difference is detected and reported); the others may differ.
struct collective_options {
  std::string cluster_id;  ///< peers must present the same id in the handshake (empty: not checked)
  std::string secret;      ///< shared secret; empty disables authentication
  std::uint32_t timeout_ms = 30000;          ///< longest wait without progress inside a collective
  std::uint32_t connect_timeout_ms = 60000;  ///< setup: how long to wait for the neighbours to appear
  std::size_t segment_bytes = 256 * 1024;    ///< reduction and forwarding granularity
  std::size_t small_bytes = 64 * 1024;       ///< allreduce up to this size uses the low-latency path
  /// The same in power-of-two worlds with `hypercube` (recursive doubling moves log2(n) times
  /// the data instead of n-1 times, so it pays off up to larger sizes).
  std::size_t hypercube_small_bytes = 256 * 1024;
  std::size_t fusion_threshold_bytes = 64 * 1024 * 1024;  ///< fuse tensors into buffers up to this size
  std::uint32_t spin_us = 20;                ///< retry the sockets (yielding) this long before blocking
  int socket_buffer_bytes = 0;               ///< SO_SNDBUF/SO_RCVBUF; 0 keeps the kernel's autotuning
  /// Power-of-two worlds of 4+ ranks: allreduce by recursive doubling (small) and recursive
  /// halving + doubling (large) over extra connections to the hypercube partners: log2(n)
  /// and 2·log2(n) sequential steps instead of n-1 and 2(n-1). Every rank must agree.
  bool hypercube = true;
  /// Set-up: each accepted connection must finish its handshake within this, so a silent
  /// socket on a rank's port holds only itself, never the ring's set-up.
  std::uint32_t handshake_timeout_ms = 10000;
  /// Set-up: at most this many handshakes in progress on a rank's port; more are refused.
  std::size_t max_pending_connections = 64;
};

/// A bound, listening socket for one rank; port 0 picks a free port (tests, rendezvous).
class ring_listener {
 public:
  /// Binds `address` ("host:port"). Errors: errc::io_error when the port is taken,
  /// errc::invalid_config when the address does not resolve.
  explicit ring_listener(const std::string& address) : fd_(detail::listen_on(address)) {}
  std::uint16_t port() const { return detail::bound_port(fd_.get()); }
  int native_handle() const noexcept { return fd_.get(); }

 private:
  friend class tcp_backend;
  ring_listener() = default;  // listens nowhere: the communicator of a single process
  detail::unique_fd fd_;
};

/// One tensor of a fused allreduce.
struct named_tensor {
  std::string name;
  tensor* value = nullptr;
};

namespace detail {
// Device tensors of a CUDA build reach a host-memory backend through host copies.
inline void copy_tensor_to_host(const tensor& t, std::span<std::byte> dst) {
  const auto src = t.bytes();
  auto p = thrust::device_pointer_cast(reinterpret_cast<const unsigned char*>(src.data()));
  thrust::copy(p, p + src.size(), reinterpret_cast<unsigned char*>(dst.data()));
}
inline void copy_tensor_from_host(std::span<const std::byte> src, tensor& t) {
  auto dst = thrust::device_pointer_cast(reinterpret_cast<unsigned char*>(t.bytes().data()));
  const auto* s = reinterpret_cast<const unsigned char*>(src.data());
  thrust::copy(s, s + src.size(), dst);
}
}  // namespace detail

/// Where a backend's buffers live: host memory (TCP ring, MPI) or device memory (NCCL).
enum class buffer_memory : std::uint8_t { host, device };

/// dtf's own backend: the ranks of a TCP ring and this process's place among them (see the
/// file comment). Users normally name it through dtf::communicator.
class tcp_backend {
 public:
  static constexpr buffer_memory memory = buffer_memory::host;

  /// Connects rank `rank` of addresses.size() ranks: listens on `listener`, connects to
  /// addresses[rank+1] and accepts addresses[rank-1]'s connection (identities are `names`,
  /// e.g. "worker.1"; empty: "rank K"). Errors: errc::timeout naming the neighbour that did
  /// not appear within connect_timeout_ms; errc::peer_failure when a neighbour refuses (other
  /// cluster, wrong secret); errc::invalid_argument for rank >= size or mismatched lists.
  tcp_backend(ring_listener listener, std::size_t rank, std::vector<std::string> addresses,
              std::vector<std::string> names = {}, collective_options options = {})
      : options_(std::move(options)), rank_(rank), size_(addresses.size()), addresses_(std::move(addresses)),
        names_(std::move(names)), listener_(std::move(listener)) {
    if (size_ == 0) throw error(errc::invalid_argument, "communicator: no ranks");
    if (rank_ >= size_)
      throw error(errc::invalid_argument,
                  "communicator: rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " ranks");
    if (names_.empty())
      for (std::size_t i = 0; i < size_; ++i) names_.push_back("rank " + std::to_string(i));
    if (names_.size() != size_)
      throw error(errc::invalid_argument, "communicator: " + std::to_string(names_.size()) + " names for " +
                                              std::to_string(size_) + " ranks");
    connect();
  }

  /// The backend of one process alone (size 1): every collective returns at once.
  static tcp_backend single(collective_options options = {}) {
    return tcp_backend(ring_listener{}, 0, {"local"}, {"rank 0"}, std::move(options));
  }

  tcp_backend(const tcp_backend&) = delete;
  tcp_backend& operator=(const tcp_backend&) = delete;
  tcp_backend(tcp_backend&&) noexcept = default;
  tcp_backend& operator=(tcp_backend&&) noexcept = default;

  std::size_t rank() const noexcept { return rank_; }
  std::size_t size() const noexcept { return size_; }
  const collective_options& options() const noexcept { return options_; }
  /// "rank 1 (worker.1 at 127.0.0.1:2223)".
  std::string describe(std::size_t r) const {
    const std::string rank_text = "rank " + std::to_string(r);
    if (names_.at(r) == rank_text) return rank_text + " (" + addresses_.at(r) + ")";
    return rank_text + " (" + names_.at(r) + " at " + addresses_.at(r) + ")";
  }

  /// In place on host bytes of dtype `type`. Errors: see the file comment.
  void allreduce_bytes(std::string_view name, dtype type, std::span<std::byte> data, reduce_op op = reduce_op::sum) {
    check_usable();
    guard([&] { do_allreduce(std::string(name), detail::fnv1a(name), type, data, op); });
  }

  /// In place: every rank's bytes become root's.
  void broadcast_bytes(std::string_view name, dtype type, std::span<std::byte> bytes, std::size_t root) {
    check_usable();
    if (root >= size_) throw error(errc::invalid_argument, "broadcast: root " + std::to_string(root));
    guard([&] { do_broadcast(std::string(name), type, bytes, root); });
  }

  /// out[k*in.size() .. (k+1)*in.size()) = rank k's in (out.size() == size() * in.size()).
  void allgather_bytes(std::string_view name, dtype type, std::span<const std::byte> in, std::span<std::byte> out) {
    check_usable();
    if (out.size() != in.size() * size_)
      throw error(errc::shape_mismatch, "allgather of '" + std::string(name) + "': output of " +
                                            std::to_string(out.size()) + " bytes for " + std::to_string(size_) +
                                            " ranks of " + std::to_string(in.size()));
    guard([&] { do_allgather(std::string(name), type, in, out); });
  }

  /// Returns once every rank has called barrier().
  void barrier() {
    check_usable();
    guard([&] { do_allreduce("<barrier>", detail::fnv1a("<barrier>"), dtype::uint8, {}, reduce_op::sum); });
  }

  /// Fused allreduce (see basic_communicator::allreduce of a list): tensors of one dtype are
  /// packed into buffers of at most fusion_threshold_bytes.
  void allreduce_fused(std::span<const named_tensor> tensors, reduce_op op) {
    check_usable();
    guard([&] { do_fused(tensors, op); });
  }

  /// Collectives completed (or started) on this communicator.
  std::uint64_t sequence() const noexcept { return sequence_; }

 private:
  void check_usable() const {
    if (failed_) throw error(errc::peer_failure, "communicator failed earlier: " + *failed_);
  }

  // Runs one collective; any failure breaks the communicator and closes its connections so
  // that the neighbours fail promptly too.
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const error& e) {
      failed_ = e.message();
      close_all();
      throw;
    } catch (const std::exception& e) {
      failed_ = e.what();
      close_all();
      throw;
    }
  }

  void close_all() {
    right_.reset();
    left_.reset();
    for (auto& p : partners_) p.reset();
  }

  std::size_t right_rank() const { return (rank_ + 1) % size_; }
  std::size_t left_rank() const { return (rank_ + size_ - 1) % size_; }

  /// Power-of-two worlds of 4 or more ranks also keep a connection to each hypercube partner
  /// (rank XOR 2^k) for recursive doubling and halving.
  bool uses_hypercube() const noexcept {
    return options_.hypercube && size_ >= 4 && (size_ & (size_ - 1)) == 0;
  }
  static std::string partner_identity(const std::string& name, std::size_t d) { return name + "/xor" + std::to_string(d); }

  // Set-up and per-collective framing: dtf/collectives/setup.hpp.
  void connect();
  detail::ring_link partner_link(std::size_t k) const;
  detail::collective_descriptor descriptor(detail::collective_kind kind, const std::string& name,
                                           std::uint64_t name_hash, dtype type, std::size_t count);
  detail::ring_step header_step(const detail::collective_descriptor& mine, std::uint64_t payload);
  detail::ring_step header_step(const detail::collective_descriptor& mine, std::uint64_t payload, std::size_t from,
                                const std::string& from_name);
  void check_type(dtype type, std::size_t bytes, const std::string& name) const;

  // Allreduce: the dispatch (dtf/collectives/dispatch.hpp) and one header per algorithm.
  void do_allreduce(const std::string& name, std::uint64_t name_hash, dtype type, std::span<std::byte> data,
                    reduce_op op);
  void two_rank_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                          detail::scale_fn scale, const std::string& context);
  void small_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                       detail::scale_fn scale, const std::string& context);
  void ring_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                      detail::scale_fn scale, const std::string& context);
  void hypercube_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                           detail::scale_fn scale, const std::string& context);
  // dtf/collectives/broadcast.hpp, allgather.hpp, fusion.hpp.
  void do_broadcast(const std::string& name, dtype type, std::span<std::byte> data, std::size_t root);
  void do_allgather(const std::string& name, dtype type, std::span<const std::byte> in, std::span<std::byte> out);
  void do_fused(std::span<const named_tensor> tensors, reduce_op op);

  collective_options options_;
  std::size_t rank_ = 0, size_ = 1;
  std::vector<std::string> addresses_, names_;
  ring_listener listener_;
  detail::unique_fd right_, left_;
  std::vector<detail::unique_fd> partners_;  // hypercube partners rank ^ 2^k (power-of-two worlds)
  detail::ring_link link_;
  std::uint64_t sequence_ = 0;
  std::optional<std::string> failed_;
  std::array<std::byte, detail::collective_header_size> out_header_{}, in_header_{};
  std::vector<std::byte> staging_, slots_, fusion_;
};

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
  using backend_type = Backend;

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

  std::size_t rank() const noexcept { return backend_.rank(); }
  std::size_t size() const noexcept { return backend_.size(); }
  std::string describe(std::size_t r) const { return backend_.describe(r); }
  /// Collectives completed (or started) on this communicator.
  std::uint64_t sequence() const noexcept { return backend_.sequence(); }
  decltype(auto) options() const
    requires requires(const Backend& b) { b.options(); }
  {
    return backend_.options();
  }
  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }

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
