// dtf/collectives/options.hpp — the knobs of a communicator, a ring listener taken before the
// ring is built, named tensors for fused calls, and where a backend's buffers live
// (dtf/collectives.hpp).
#pragma once

#include <dtf/config.hpp>
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
  /// The ranks' shared key (dtf::train passes the ring key R of docs/design/identity.md): every
  /// rank holds it, so a rank can present any rank's name to another rank, but not reach a ps.
  /// Empty disables authentication.
  std::string secret;
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
  /// Set-up: each accepted connection must finish its handshakes (TLS and dtf) within this,
  /// from its accept, so a silent socket on a rank's port (or the MPI rendezvous) holds its
  /// slot this long at most, never the ring's set-up.
  std::uint32_t handshake_timeout_ms = 2000;
  /// Set-up: at most this many handshakes in progress on a rank's port from the hosts of the
  /// ring's ranks, and as many again from other addresses, which cannot take the ranks' (the
  /// MPI rendezvous, which does not know the ranks' hosts beforehand, has one budget). A
  /// connection over it is closed at once, unanswered; a rank whose connection is closed that
  /// way tries again (5 ms doubling to 200 ms) until connect_timeout_ms, so it gets in once a
  /// slot frees.
  std::size_t max_pending_connections = 64;
  /// Set-up: of those, at most this many from one remote IP address (any port), so that one
  /// host's strangers cannot take every slot; over it a connection is closed at once, as above.
  std::size_t max_pending_per_source = 8;
  /// Every connection between ranks (ring, hypercube partners, MPI rendezvous) inside TLS 1.3
  /// keyed by `secret` and `cluster_id`, as the request/reply transport's (dtf/transport/tls.hpp):
  /// encrypted and authenticated from its first byte. Needs a secret; every rank must agree (a
  /// TLS rank and a plain one refuse each other, naming the cause).
  bool tls = false;
};

/// A bound, listening socket for one rank; port 0 picks a free port (tests, rendezvous).
class ring_listener {
 public:
  /// Binds `address` ("host:port"). Errors: errc::io_error when the port is taken,
  /// errc::invalid_config when the address does not resolve.
  explicit ring_listener(const std::string& address) : fd_(detail::listen_on(address)) {}
  /// The port it listens on.
  std::uint16_t port() const { return detail::bound_port(fd_.get()); }
  /// The socket's file descriptor.
  int native_handle() const noexcept { return fd_.get(); }

 private:
  friend class tcp_backend;
  ring_listener() = default;  // listens nowhere: the communicator of a single process
  detail::unique_fd fd_;
};

/// One tensor of a fused allreduce.
struct named_tensor {
  /// The tensor's name (the same on every rank).
  std::string name;
  /// The tensor, reduced in place.
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

}  // namespace dtf
