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
  friend class communicator;
  ring_listener() = default;  // listens nowhere: the communicator of a single process
  detail::unique_fd fd_;
};

/// One tensor of a fused allreduce.
struct named_tensor {
  std::string name;
  tensor* value = nullptr;
};

/// The ranks of a ring and this process's place among them. See the file comment.
class communicator {
 public:
  /// Connects rank `rank` of addresses.size() ranks: listens on `listener`, connects to
  /// addresses[rank+1] and accepts addresses[rank-1]'s connection (identities are `names`,
  /// e.g. "worker.1"; empty: "rank K"). Errors: errc::timeout naming the neighbour that did
  /// not appear within connect_timeout_ms; errc::peer_failure when a neighbour refuses (other
  /// cluster, wrong secret); errc::invalid_argument for rank >= size or mismatched lists.
  communicator(ring_listener listener, std::size_t rank, std::vector<std::string> addresses,
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

  /// The communicator of one process alone (size 1): every collective returns at once.
  static communicator single(collective_options options = {}) {
    return communicator(ring_listener{}, 0, {"local"}, {"rank 0"}, std::move(options));
  }

  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;

  std::size_t rank() const noexcept { return rank_; }
  std::size_t size() const noexcept { return size_; }
  const collective_options& options() const noexcept { return options_; }
  /// "rank 1 (worker.1 at 127.0.0.1:2223)".
  std::string describe(std::size_t r) const {
    const std::string rank_text = "rank " + std::to_string(r);
    if (names_.at(r) == rank_text) return rank_text + " (" + addresses_.at(r) + ")";
    return rank_text + " (" + names_.at(r) + " at " + addresses_.at(r) + ")";
  }

  /// In place: data becomes op over every rank's data. All ranks pass the same name, size and
  /// element type. Errors: see the file comment.
  template <tensor_element T>
  void allreduce(std::string_view name, std::span<T> data, reduce_op op = reduce_op::sum) {
    allreduce_bytes(name, dtype_v<T>, std::as_writable_bytes(data), op);
  }

  /// allreduce on raw bytes of dtype `type` (host memory).
  void allreduce_bytes(std::string_view name, dtype type, std::span<std::byte> data, reduce_op op = reduce_op::sum) {
    check_usable();
    guard([&] { do_allreduce(std::string(name), detail::fnv1a(name), type, data, op); });
  }

  /// In place: every rank's data becomes root's. Errors: see the file comment.
  template <tensor_element T>
  void broadcast(std::string_view name, std::span<T> data, std::size_t root = 0) {
    check_usable();
    if (root >= size_)
      throw error(errc::invalid_argument, "broadcast of '" + std::string(name) + "': root " + std::to_string(root) +
                                              " of " + std::to_string(size_) + " ranks");
    guard([&] { do_broadcast(std::string(name), dtype_v<T>, std::as_writable_bytes(data), root); });
  }

  /// out[k*in.size() .. (k+1)*in.size()) = rank k's in, on every rank (out.size() must be
  /// size() * in.size()).
  template <tensor_element T>
  void allgather(std::string_view name, std::span<const T> in, std::span<T> out) {
    check_usable();
    if (out.size() != in.size() * size_)
      throw error(errc::shape_mismatch, "allgather of '" + std::string(name) + "': output of " +
                                            std::to_string(out.size()) + " elements for " + std::to_string(size_) +
                                            " ranks of " + std::to_string(in.size()));
    guard([&] { do_allgather(std::string(name), dtype_v<T>, std::as_bytes(in), std::as_writable_bytes(out)); });
  }

  /// Returns once every rank has called barrier().
  void barrier() {
    check_usable();
    guard([&] { do_allreduce("<barrier>", detail::fnv1a("<barrier>"), dtype::uint8, {}, reduce_op::sum); });
  }

  /// Fused allreduce of several tensors (any dtypes): consecutive tensors of one dtype are
  /// packed into one buffer of at most fusion_threshold_bytes, reduced together and unpacked;
  /// a tensor larger than the threshold is reduced in place. Every rank passes the same list.
  void allreduce(std::span<const named_tensor> tensors, reduce_op op = reduce_op::sum) {
    check_usable();
    guard([&] { do_fused(tensors, op); });
  }

  /// allreduce of one tensor (staged through host memory on CUDA builds).
  void allreduce(std::string_view name, tensor& t, reduce_op op = reduce_op::sum) {
    named_tensor one{std::string(name), &t};
    allreduce(std::span<const named_tensor>(&one, 1), op);
  }

  /// broadcast of one tensor from root (staged through host memory on CUDA builds).
  void broadcast(std::string_view name, tensor& t, std::size_t root = 0) {
    if constexpr (device_memory_is_host_accessible) {
      broadcast_bytes(name, t.type(), t.bytes(), root);
    } else {
      std::vector<std::byte> host(t.size_bytes());
      copy_to_host(t, host);
      broadcast_bytes(name, t.type(), host, root);
      copy_from_host(host, t);
    }
  }

  /// Collectives completed (or started) on this communicator.
  std::uint64_t sequence() const noexcept { return sequence_; }

 private:
  void broadcast_bytes(std::string_view name, dtype type, std::span<std::byte> bytes, std::size_t root) {
    check_usable();
    if (root >= size_) throw error(errc::invalid_argument, "broadcast: root " + std::to_string(root));
    guard([&] { do_broadcast(std::string(name), type, bytes, root); });
  }

  static void copy_to_host(const tensor& t, std::span<std::byte> dst) {
    const auto src = t.bytes();
    auto p = thrust::device_pointer_cast(reinterpret_cast<const unsigned char*>(src.data()));
    thrust::copy(p, p + src.size(), reinterpret_cast<unsigned char*>(dst.data()));
  }
  static void copy_from_host(std::span<const std::byte> src, tensor& t) {
    auto dst = thrust::device_pointer_cast(reinterpret_cast<unsigned char*>(t.bytes().data()));
    const auto* s = reinterpret_cast<const unsigned char*>(src.data());
    thrust::copy(s, s + src.size(), dst);
  }

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

  void connect() {
    if (size_ == 1) return;
    using namespace std::chrono;
    const auto deadline = detail::ring_clock::now() + milliseconds(options_.connect_timeout_ms);
    struct incoming {
      std::string identity;
      detail::unique_fd* slot;
    };
    struct outgoing {
      std::size_t to;
      std::string identity;
      detail::unique_fd* slot;
    };
    std::vector<incoming> in{{names_[left_rank()], &left_}};
    std::vector<outgoing> out{{right_rank(), names_[rank_], &right_}};
    if (uses_hypercube()) {
      partners_.resize(std::size_t(std::countr_zero(size_)));
      for (std::size_t k = 0; k < partners_.size(); ++k) {
        const std::size_t d = std::size_t(1) << k, p = rank_ ^ d;
        if (rank_ & d)
          in.push_back({partner_identity(names_[p], d), &partners_[k]});
        else
          out.push_back({p, partner_identity(names_[rank_], d), &partners_[k]});
      }
    }
    const detail::handshake_identity server_me{options_.cluster_id, names_[rank_], options_.secret};
    std::exception_ptr accept_failure;
    std::thread acceptor([&] {
      // Setup only: the data path never leaves the calling thread.
      try {
        std::vector<std::string> expected;
        for (const auto& i : in) expected.push_back(i.identity);
        auto fds = detail::accept_neighbours(listener_.native_handle(), server_me, expected, deadline,
                                             {options_.handshake_timeout_ms, options_.max_pending_connections});
        for (std::size_t i = 0; i < in.size(); ++i) *in[i].slot = std::move(fds[i]);
      } catch (...) {
        accept_failure = std::current_exception();
      }
    });
    try {
      for (auto& o : out) {
        const std::string who = describe(o.to);
        *o.slot = detail::connect_with_retry(addresses_[o.to], who, deadline);
        detail::client_handshake(o.slot->get(), {options_.cluster_id, o.identity, options_.secret}, deadline, who);
      }
    } catch (...) {
      right_.reset();
      for (auto& p : partners_) p.reset();
      acceptor.join();
      throw;
    }
    acceptor.join();
    if (accept_failure) std::rethrow_exception(accept_failure);
    detail::tune_stream_socket(right_.get(), options_.socket_buffer_bytes);
    detail::tune_stream_socket(left_.get(), options_.socket_buffer_bytes);
    for (auto& p : partners_) detail::tune_stream_socket(p.get(), options_.socket_buffer_bytes);
    link_.right = right_.get();
    link_.left = left_.get();
    link_.right_name = describe(right_rank());
    link_.left_name = describe(left_rank());
    link_.timeout_ms = options_.timeout_ms;
    link_.spin_us = options_.spin_us;
    link_.segment_bytes = options_.segment_bytes;
  }

  // The link to hypercube partner rank ^ 2^k (one bidirectional connection).
  detail::ring_link partner_link(std::size_t k) const {
    detail::ring_link l = link_;
    l.right = l.left = partners_[k].get();
    l.right_name = l.left_name = describe(rank_ ^ (std::size_t(1) << k));
    return l;
  }

  detail::collective_descriptor descriptor(detail::collective_kind kind, const std::string& name,
                                           std::uint64_t name_hash, dtype type, std::size_t count) {
    detail::collective_descriptor d;
    d.sequence = sequence_++;
    d.origin = std::uint32_t(rank_);
    d.world = std::uint32_t(size_);
    d.kind = kind;
    d.type = type;
    d.count = count;
    d.name = name;
    d.name_hash = name_hash;
    return d;
  }

  // A step that sends our descriptor and receives the left neighbour's, then checks it.
  detail::ring_step header_step(const detail::collective_descriptor& mine, std::uint64_t payload) {
    return header_step(mine, payload, left_rank(), link_.left_name);
  }
  detail::ring_step header_step(const detail::collective_descriptor& mine, std::uint64_t payload, std::size_t from,
                                const std::string& from_name) {
    out_header_ = detail::encode_descriptor(mine, payload);
    detail::ring_step s;
    s.send = out_header_.data();
    s.send_bytes = out_header_.size();
    s.recv = in_header_.data();
    s.recv_bytes = in_header_.size();
    s.on_received = [this, &mine, from, from_name] {
      const auto theirs = detail::decode_descriptor(in_header_, from_name);
      detail::check_descriptor(mine, theirs, describe(from));
    };
    return s;
  }

  void check_type(dtype type, std::size_t bytes, const std::string& name) const {
    if (dtf::size_of(type) == 0 || bytes % size_of(type) != 0)
      throw error(errc::invalid_argument, "collective on '" + name + "': " + std::to_string(bytes) +
                                              " bytes is not a whole number of " + std::string(name_of(type)));
  }

  void do_allreduce(const std::string& name, std::uint64_t name_hash, dtype type, std::span<std::byte> data,
                    reduce_op op) {
    check_type(type, data.size(), name);
    const std::size_t esize = size_of(type);
    const std::size_t count = data.size() / esize;
    auto d = descriptor(detail::collective_kind::allreduce, name, name_hash, type, count);
    d.op = op;
    if (size_ == 1) return;  // the sum, min, max and average of one rank's values are its values
    const auto reduce = detail::reduce_for(type, op);
    const auto scale = detail::scale_for(type);
    const std::string context = "rank " + std::to_string(rank_) + ": " + d.describe();
    const std::size_t n = size_;
    std::vector<detail::ring_step> steps;
    if (uses_hypercube()) return hypercube_allreduce(d, data, reduce, scale, context);
    if (n == 2 && data.size() <= options_.small_bytes) {
      // Two ranks: one exchange straight from and into the caller's buffer (a + b == b + a,
      // so both ranks end with the same bits).
      d.algorithm = detail::ring_algorithm::small;
      staging_.resize(data.size());
      steps.push_back(header_step(d, data.size()));
      detail::ring_step st;
      st.send = data.data();
      st.send_bytes = data.size();
      st.recv = staging_.data();
      st.recv_bytes = data.size();
      steps.push_back(std::move(st));
      detail::run_ring(link_, steps, reduce, scale, context);
      if (!data.empty()) {
        reduce(data.data(), staging_.data(), data.size());
        if (op == reduce_op::average) scale(data.data(), data.size(), n);
      }
      return;
    }
    if (data.size() <= options_.small_bytes) {
      // Every rank's [header|data] goes around the ring; each received slot is checked.
      d.algorithm = detail::ring_algorithm::small;
      const std::size_t slot = detail::collective_header_size + data.size();
      slots_.resize(slot * n);
      const auto h = detail::encode_descriptor(d, data.size());
      std::memcpy(slots_.data(), h.data(), h.size());
      if (!data.empty()) std::memcpy(slots_.data() + h.size(), data.data(), data.size());
      for (std::size_t g = 0; g + 1 < n; ++g) {
        detail::ring_step s;
        s.send = slots_.data() + g * slot;
        s.send_bytes = slot;
        s.recv = slots_.data() + (g + 1) * slot;
        s.recv_bytes = slot;
        s.gated = true;
        const std::size_t origin = (rank_ + n - g - 1) % n;
        s.on_received = [this, &d, slot, g, origin] {
          const auto theirs = detail::decode_descriptor(
              std::span<const std::byte, detail::collective_header_size>(slots_.data() + (g + 1) * slot,
                                                                         detail::collective_header_size),
              link_.left_name);
          detail::check_descriptor(d, theirs, describe(origin));
          if (theirs.origin != origin)
            throw error(errc::peer_failure, link_.left_name + " forwarded rank " + std::to_string(theirs.origin) +
                                                "'s data where rank " + std::to_string(origin) + "'s was due");
        };
        steps.push_back(std::move(s));
      }
      detail::run_ring(link_, steps, reduce, scale, context);
      // Reduce in rank order 0..n-1 on every rank: identical bits everywhere.
      const auto slot_data = [&](std::size_t k) {
        return slots_.data() + ((rank_ + n - k) % n) * slot + detail::collective_header_size;
      };
      if (!data.empty()) {
        std::memcpy(data.data(), slot_data(0), data.size());
        for (std::size_t k = 1; k < n; ++k) reduce(data.data(), slot_data(k), data.size());
        if (op == reduce_op::average) scale(data.data(), data.size(), n);
      }
      return;
    }
    d.algorithm = detail::ring_algorithm::ring;
    std::size_t max_chunk = 0;
    for (std::size_t i = 0; i < n; ++i) max_chunk = std::max(max_chunk, detail::chunk_of(count, n, i).size());
    const std::size_t window = 2 * detail::ring_segment(options_.segment_bytes);
    staging_.resize(std::min(max_chunk * esize, window));
    std::byte* base = data.data();
    const auto chunk_ptr = [&](std::size_t i) { return base + detail::chunk_of(count, n, i).begin * esize; };
    const auto chunk_bytes = [&](std::size_t i) { return detail::chunk_of(count, n, i).size() * esize; };
    steps.push_back(header_step(d, data.size()));
    for (std::size_t s = 0; s + 1 < n; ++s) {  // reduce-scatter
      const std::size_t send_chunk = (rank_ + n - s) % n, recv_chunk = (rank_ + 2 * n - s - 1) % n;
      detail::ring_step st;
      st.send = chunk_ptr(send_chunk);
      st.send_bytes = chunk_bytes(send_chunk);
      st.recv = staging_.data();
      st.recv_bytes = chunk_bytes(recv_chunk);
      st.reduce_into = chunk_ptr(recv_chunk);
      st.windowed = true;
      st.gated = s > 0;
      if (s + 2 == n && op == reduce_op::average) st.divide_by = n;  // this rank's final chunk
      steps.push_back(std::move(st));
    }
    for (std::size_t s = 0; s + 1 < n; ++s) {  // allgather
      const std::size_t send_chunk = (rank_ + 1 + n - s) % n, recv_chunk = (rank_ + n - s) % n;
      detail::ring_step st;
      st.send = chunk_ptr(send_chunk);
      st.send_bytes = chunk_bytes(send_chunk);
      st.recv = chunk_ptr(recv_chunk);
      st.recv_bytes = chunk_bytes(recv_chunk);
      st.gated = true;
      steps.push_back(std::move(st));
    }
    detail::run_ring(link_, steps, reduce, scale, context);
  }

  // Power-of-two worlds. Small: recursive doubling, log2(n) exchanges of the whole buffer
  // with partner rank ^ 2^k. Large: recursive halving (reduce-scatter: keep half the range,
  // send the other half, d = n/2 .. 1) then recursive doubling (allgather, d = 1 .. n/2).
  // Every pairwise sum is commutative, so all ranks end with the same bits.
  void hypercube_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                           detail::scale_fn scale, const std::string& context) {
    const std::size_t esize = size_of(d.type), count = data.size() / esize, stages = partners_.size();
    std::vector<detail::ring_step> steps;
    if (data.size() <= options_.hypercube_small_bytes) {
      d.algorithm = detail::ring_algorithm::recursive_doubling;
      staging_.resize(data.size());
      for (std::size_t k = 0; k < stages; ++k) {
        const auto link = partner_link(k);
        steps.clear();
        steps.push_back(header_step(d, data.size(), rank_ ^ (std::size_t(1) << k), link.left_name));
        detail::ring_step st;
        st.send = data.data();
        st.send_bytes = data.size();
        st.recv = staging_.data();
        st.recv_bytes = data.size();
        steps.push_back(std::move(st));
        detail::run_ring(link, steps, reduce, scale, context);
        if (!data.empty()) reduce(data.data(), staging_.data(), data.size());
      }
      if (d.op == reduce_op::average && !data.empty()) scale(data.data(), data.size(), size_);
      return;
    }
    d.algorithm = detail::ring_algorithm::halving_doubling;
    staging_.resize(std::min((count / 2 + 1) * esize, 2 * detail::ring_segment(options_.segment_bytes)));
    std::vector<std::pair<std::size_t, std::size_t>> before(stages);
    std::size_t b = 0, e = count;
    for (std::size_t k = stages; k-- > 0;) {  // reduce-scatter by recursive halving
      const std::size_t dist = std::size_t(1) << k, mid = b + (e - b) / 2;
      const bool lower = (rank_ & dist) == 0;
      const std::size_t sb = lower ? mid : b, se = lower ? e : mid, kb = lower ? b : mid, ke = lower ? mid : e;
      const auto link = partner_link(k);
      steps.clear();
      steps.push_back(header_step(d, data.size(), rank_ ^ dist, link.left_name));
      detail::ring_step st;
      st.send = data.data() + sb * esize;
      st.send_bytes = (se - sb) * esize;
      st.recv = staging_.data();
      st.recv_bytes = (ke - kb) * esize;
      st.reduce_into = data.data() + kb * esize;
      st.windowed = true;
      if (k == 0 && d.op == reduce_op::average) st.divide_by = size_;  // this rank's final block
      steps.push_back(std::move(st));
      detail::run_ring(link, steps, reduce, scale, context);
      before[k] = {b, e};
      b = kb;
      e = ke;
    }
    for (std::size_t k = 0; k < stages; ++k) {  // allgather by recursive doubling
      const auto [ob, oe] = before[k];
      const bool lower = (rank_ & (std::size_t(1) << k)) == 0;  // we kept the lower half at this stage
      const std::size_t pb = lower ? e : ob, pe = lower ? oe : b;
      steps.clear();
      detail::ring_step st;
      st.send = data.data() + b * esize;
      st.send_bytes = (e - b) * esize;
      st.recv = data.data() + pb * esize;
      st.recv_bytes = (pe - pb) * esize;
      steps.push_back(std::move(st));
      detail::run_ring(partner_link(k), steps, reduce, scale, context);
      b = ob;
      e = oe;
    }
  }

  void do_broadcast(const std::string& name, dtype type, std::span<std::byte> data, std::size_t root) {
    check_type(type, data.size(), name);
    auto d = descriptor(detail::collective_kind::broadcast, name, detail::fnv1a(name), type, data.size() / size_of(type));
    d.root = std::uint32_t(root);
    if (size_ == 1) return;
    const std::size_t n = size_, distance = (rank_ + n - root) % n;
    std::vector<detail::ring_step> steps;
    steps.push_back(header_step(d, data.size()));
    detail::ring_step first;
    if (distance == 0) {
      first.send = data.data();
      first.send_bytes = data.size();
    } else {
      first.recv = data.data();
      first.recv_bytes = data.size();
    }
    steps.push_back(std::move(first));
    if (distance != 0 && distance + 1 < n) {  // forward what arrives, segment by segment
      detail::ring_step forward;
      forward.send = data.data();
      forward.send_bytes = data.size();
      forward.gated = true;
      steps.push_back(std::move(forward));
    }
    detail::run_ring(link_, steps, detail::reduce_for(type, reduce_op::sum), detail::scale_for(type),
                     "rank " + std::to_string(rank_) + ": " + d.describe());
  }

  void do_allgather(const std::string& name, dtype type, std::span<const std::byte> in, std::span<std::byte> out) {
    check_type(type, in.size(), name);
    auto d = descriptor(detail::collective_kind::allgather, name, detail::fnv1a(name), type, in.size() / size_of(type));
    const std::size_t n = size_, block = in.size();
    if (block) std::memmove(out.data() + rank_ * block, in.data(), block);
    if (n == 1) return;
    std::vector<detail::ring_step> steps;
    steps.push_back(header_step(d, block * (n - 1)));
    for (std::size_t s = 0; s + 1 < n; ++s) {
      detail::ring_step st;
      st.send = out.data() + ((rank_ + n - s) % n) * block;
      st.send_bytes = block;
      st.recv = out.data() + ((rank_ + 2 * n - s - 1) % n) * block;
      st.recv_bytes = block;
      st.gated = s > 0;
      steps.push_back(std::move(st));
    }
    detail::run_ring(link_, steps, detail::reduce_for(type, reduce_op::sum), detail::scale_for(type),
                     "rank " + std::to_string(rank_) + ": " + d.describe());
  }

  void do_fused(std::span<const named_tensor> tensors, reduce_op op) {
    std::size_t i = 0;
    while (i < tensors.size()) {
      const named_tensor& first = tensors[i];
      if (!first.value) throw error(errc::invalid_argument, "allreduce: tensor '" + first.name + "' is null");
      const dtype type = first.value->type();
      std::size_t j = i, bytes = 0;
      std::uint64_t hash = detail::fnv1a("fused");
      while (j < tensors.size() && tensors[j].value && tensors[j].value->type() == type &&
             (j == i || bytes + tensors[j].value->size_bytes() <= options_.fusion_threshold_bytes)) {
        bytes += tensors[j].value->size_bytes();
        hash = detail::fnv1a(tensors[j].name, hash);
        hash = detail::fnv1a(std::to_string(tensors[j].value->size()) + ";", hash);
        ++j;
      }
      if (j == i + 1) {
        tensor& t = *first.value;
        if constexpr (device_memory_is_host_accessible) {
          do_allreduce(first.name, detail::fnv1a(first.name), type, t.bytes(), op);
        } else {
          fusion_.resize(t.size_bytes());
          copy_to_host(t, fusion_);
          do_allreduce(first.name, detail::fnv1a(first.name), type, fusion_, op);
          copy_from_host(fusion_, t);
        }
      } else {
        fusion_.resize(bytes);
        std::size_t at = 0;
        for (std::size_t k = i; k < j; ++k) {
          const tensor& t = *tensors[k].value;
          copy_to_host(t, std::span<std::byte>(fusion_.data() + at, t.size_bytes()));
          at += t.size_bytes();
        }
        const std::string name = first.name + " + " + std::to_string(j - i - 1) + " more (fused)";
        do_allreduce(name, hash, type, fusion_, op);
        at = 0;
        for (std::size_t k = i; k < j; ++k) {
          tensor& t = *tensors[k].value;
          copy_from_host(std::span<const std::byte>(fusion_.data() + at, t.size_bytes()), t);
          at += t.size_bytes();
        }
      }
      i = j;
    }
  }

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

namespace detail {

struct rendezvous_register_msg {
  std::uint32_t rank = 0;
  std::uint16_t port = 0;
  template <class A>
  void serialize(A& ar) {
    ar(rank, port);
  }
};
struct rendezvous_table_msg {
  std::vector<std::string> addresses;
  template <class A>
  void serialize(A& ar) {
    ar(addresses);
  }
};

/// The training ranks of a cluster in ring order: the chief (if a chief job exists), then the
/// workers by index.
inline std::vector<task_id> ring_tasks(const cluster& c) {
  std::vector<task_id> out;
  for (const auto& t : c.spec.tasks("chief")) out.push_back(t);
  for (const auto& t : c.spec.tasks("worker")) out.push_back(t);
  return out;
}

}  // namespace detail

/// Builds the communicator of the training tasks (chief, workers) of `c`; this process must be
/// one of them. Under mpirun (c.source == "mpi", addresses not known yet) the ranks first meet
/// at c.rendezvous: rank 0 listens there, every other rank listens on a free port and reports
/// it (with the address it reaches rank 0 from), and rank 0 sends everyone the table, which is
/// written into c.spec. The rendezvous uses the same handshake as the ring. Errors: those of
/// the communicator's constructor; errc::invalid_config when this task is not a training task.
inline communicator make_communicator(cluster& c, collective_options options = {}) {
  const auto tasks = detail::ring_tasks(c);
  std::size_t rank = tasks.size();
  for (std::size_t i = 0; i < tasks.size(); ++i)
    if (tasks[i] == c.self) rank = i;
  if (rank == tasks.size())
    throw error(errc::invalid_config, "make_communicator: " + c.self.str() + " is not a chief or worker task");
  std::vector<std::string> names;
  for (const auto& t : tasks) names.push_back(t.str());
  const std::size_t n = tasks.size();
  const detail::handshake_identity me{options.cluster_id, names[rank], options.secret};
  const auto deadline =
      detail::ring_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);

  if (c.source == "mpi" && !c.rendezvous.empty()) {
    std::vector<std::string> addresses(n);
    if (rank == 0) {
      ring_listener listener(c.rendezvous);
      addresses[0] = c.rendezvous;
      std::vector<detail::unique_fd> peers;
      std::size_t registered = 1;
      std::string last;
      while (registered < n) {
        detail::unique_fd fd = detail::accept_one(listener.native_handle(), deadline,
                                                  std::to_string(n - registered) + " more ranks at the rendezvous " +
                                                      c.rendezvous + (last.empty() ? "" : " (refused: " + last + ")"));
        try {
          const std::string who = "rendezvous peer";
          const std::string identity = detail::server_handshake(fd.get(), me, deadline, who);
          auto [h, meta] = detail::read_control(fd.get(), deadline, identity);
          if (h.kind != detail::message_kind::rendezvous_register)
            throw error(errc::peer_failure, identity + ": expected a rendezvous registration");
          const auto reg = detail::decode_message<detail::rendezvous_register_msg>(meta, "rendezvous registration");
          if (reg.rank == 0 || reg.rank >= n || !addresses[reg.rank].empty() || identity != names[reg.rank])
            throw error(errc::peer_failure, "'" + identity + "' registered as rank " + std::to_string(reg.rank));
          sockaddr_storage s{};
          socklen_t len = sizeof s;
          ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&s), &len);
          std::string host = detail::address_text(s);
          host = host.substr(0, host.rfind(':'));
          addresses[reg.rank] = host + ":" + std::to_string(reg.port);
          peers.push_back(std::move(fd));
          ++registered;
        } catch (const error& e) {
          last = e.message();
        }
      }
      const auto table = detail::encode_message(detail::rendezvous_table_msg{addresses});
      for (auto& p : peers) detail::write_control(p.get(), detail::message_kind::rendezvous_table, table, deadline, "rank");
      for (std::size_t r = 0; r < n; ++r) c.spec.jobs[tasks[r].job][tasks[r].index] = addresses[r];
      return communicator(std::move(listener), rank, std::move(addresses), std::move(names), std::move(options));
    }
    ring_listener listener("0.0.0.0:0");
    const std::string who = "rank 0 (" + names[0] + ") at the rendezvous " + c.rendezvous;
    detail::unique_fd fd = detail::connect_with_retry(c.rendezvous, who, deadline);
    detail::client_handshake(fd.get(), me, deadline, who);
    detail::write_control(fd.get(), detail::message_kind::rendezvous_register,
                          detail::encode_message(detail::rendezvous_register_msg{std::uint32_t(rank), listener.port()}),
                          deadline, who);
    auto [h, meta] = detail::read_control(fd.get(), deadline, who);
    if (h.kind != detail::message_kind::rendezvous_table)
      throw error(errc::peer_failure, who + ": expected the rendezvous table");
    auto table = detail::decode_message<detail::rendezvous_table_msg>(meta, "rendezvous table");
    if (table.addresses.size() != n)
      throw error(errc::peer_failure, who + ": table of " + std::to_string(table.addresses.size()) + " ranks, expected " +
                                          std::to_string(n));
    for (std::size_t r = 0; r < n; ++r) c.spec.jobs[tasks[r].job][tasks[r].index] = table.addresses[r];
    return communicator(std::move(listener), rank, std::move(table.addresses), std::move(names), std::move(options));
  }

  std::vector<std::string> addresses;
  for (const auto& t : tasks) addresses.push_back(c.spec.address(t));
  ring_listener listener(addresses[rank]);
  return communicator(std::move(listener), rank, std::move(addresses), std::move(names), std::move(options));
}

}  // namespace dtf
