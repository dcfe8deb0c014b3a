// dtf/detail/ring_socket.hpp — POSIX TCP sockets for the collectives: listening, connecting
// with retry, accepting, and bounded blocking reads and writes (through the connection's TLS
// layer, dtf/detail/ring_tls.hpp, when TLS is on). The first exchanges on a connection (TLS and
// dtf handshakes) are dtf/detail/ring_handshake.hpp's.
//
// Why not Asio here: the collectives drive their data path from the calling thread with
// non-blocking send()/recv() and poll(), which needs nothing of Asio's machinery and keeps the
// header usable from nvcc translation units.
#pragma once

#include <dtf/detail/ring_tls.hpp>
#include <dtf/error.hpp>
#include <dtf/transport/address.hpp>
#include <dtf/transport/inherited.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtf::detail {

using ring_clock = std::chrono::steady_clock;

/// An owned file descriptor.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// A connected socket and, when TLS is on, its TLS layer (every byte of the connection passes
/// through it).
struct ring_connection {
  unique_fd fd;
  std::unique_ptr<ring_tls> tls;

  int get() const noexcept { return fd.get(); }
  explicit operator bool() const noexcept { return bool(fd); }
  void reset() noexcept {
    fd.reset();
    tls.reset();
  }
};

/// A connection as the blocking helpers below see it: the socket and its TLS layer (null: plain).
/// A plain descriptor converts to it.
struct ring_io {
  int fd = -1;
  ring_tls* tls = nullptr;
  ring_io(int f, ring_tls* t = nullptr) noexcept : fd(f), tls(t) {}  // NOLINT: a plain fd is a plain ring_io
  ring_io(const ring_connection& c) noexcept : fd(c.get()), tls(c.tls.get()) {}  // NOLINT
};

inline std::string errno_text(int e) { return std::strerror(e); }

inline void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw error(errc::io_error, "fcntl(O_NONBLOCK): " + errno_text(errno));
}

/// Low latency and large socket buffers: the ring writes whole chunks at once.
inline void tune_stream_socket(int fd, int buffer_bytes) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buffer_bytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
}

struct resolved_address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_INET;
};

inline resolved_address resolve_address(const std::string& address, bool passive) {
  std::string why;
  const auto parsed = transport::parse_address(address, passive ? transport::address_use::bind
                                                                : transport::address_use::connect, why);
  if (!parsed) throw error(errc::invalid_config, "address '" + address + "': " + why);
  const std::string& host = parsed->host;
  const std::string port = std::to_string(parsed->port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || !result)
    throw error(errc::invalid_config, "cannot resolve '" + address + "': " + ::gai_strerror(rc));
  resolved_address out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.length = socklen_t(result->ai_addrlen);
  out.family = result->ai_family;
  ::freeaddrinfo(result);
  return out;
}

inline std::string address_text(const sockaddr_storage& s) {
  char host[INET6_ADDRSTRLEN] = {};
  std::uint16_t port = 0;
  if (s.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&s);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&s);
  ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  port = ntohs(a->sin_port);
  return std::string(host) + ":" + std::to_string(port);
}

/// The local address of a connected socket ("10.0.0.5:41234").
inline std::string local_address(int fd) {
  sockaddr_storage s{};
  socklen_t len = sizeof s;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0)
    throw error(errc::io_error, "getsockname: " + errno_text(errno));
  return address_text(s);
}

/// A listening socket ("host:port"; port 0 picks a free one). Non-blocking.
inline unique_fd listen_on(const std::string& address) {
  // The launcher's socket for this address when it handed one down (dtf/transport/inherited.hpp).
  if (unique_fd inherited(transport::take_inherited_listener(address)); inherited) {
    set_nonblocking(inherited.get());
    return inherited;
  }
  const auto a = resolve_address(address, true);
  unique_fd fd(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw error(errc::io_error, "socket: " + errno_text(errno));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0)
    throw error(errc::io_error, "cannot listen on " + address + ": " + errno_text(errno));
  if (::listen(fd.get(), 64) != 0) throw error(errc::io_error, "listen on " + address + ": " + errno_text(errno));
  set_nonblocking(fd.get());
  return fd;
}

inline std::uint16_t bound_port(int fd) {
  sockaddr_storage s{};
  socklen_t len = sizeof s;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0)
    throw error(errc::io_error, "getsockname: " + errno_text(errno));
  if (s.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&s)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&s)->sin_port);
}

inline int remaining_ms(ring_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - ring_clock::now()).count();
  return left <= 0 ? 0 : int(std::min<long long>(left, 1 << 30));
}

/// Waits for `events` on fd until the deadline; false on deadline. POLLERR/POLLHUP count as ready
/// (the following read or write reports the error).
inline bool wait_fd(int fd, short events, ring_clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw error(errc::io_error, "poll: " + errno_text(errno));
  }
}

/// Connects to `address`, retrying refused connections (the peer may still be starting) with
/// a bounded backoff until the deadline. `who` names the peer in errors.
inline unique_fd connect_with_retry(const std::string& address, const std::string& who,
                                    ring_clock::time_point deadline) {
  const auto a = resolve_address(address, false);
  auto backoff = std::chrono::milliseconds(5);
  std::string last = "no attempt";
  for (;;) {
    unique_fd fd(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) throw error(errc::io_error, "socket: " + errno_text(errno));
    set_nonblocking(fd.get());
    int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.length);
    if (rc != 0 && errno == EINPROGRESS) {
      if (!wait_fd(fd.get(), POLLOUT, deadline)) break;
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) return fd;
    last = errno_text(errno);
    if (ring_clock::now() + backoff >= deadline) break;
    // Bounded retry pause between connection attempts to a peer that is not listening yet.
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  throw error(errc::timeout, who + " (" + address + "): not reachable in time (last error: " + last + ")");
}

/// Sends the ciphertext `tls` holds before the deadline.
inline void flush_tls(int fd, ring_tls& tls, ring_clock::time_point deadline, const std::string& who) {
  while (tls.unsent() > 0) {
    const auto st = tls.send_some(fd);
    if (st == ring_tls::io::failed)
      throw error(errc::peer_failure, who + ": connection lost while sending: " + tls.failure());
    if (st == ring_tls::io::would_block && !wait_fd(fd, POLLOUT, deadline))
      throw error(errc::timeout, who + ": timed out sending");
  }
}

/// Writes all of `data` before the deadline (non-blocking socket; with TLS, encrypted).
inline void write_all(ring_io io, std::span<const std::byte> data, ring_clock::time_point deadline,
                      const std::string& who) {
  if (io.tls) {
    while (!data.empty()) {
      const std::size_t n = std::min(data.size(), ring_tls_encrypt_chunk);
      if (!io.tls->encrypt(data.data(), n)) throw error(errc::peer_failure, who + ": " + io.tls->failure());
      data = data.subspan(n);
      flush_tls(io.fd, *io.tls, deadline, who);
    }
    return;
  }
  const int fd = io.fd;
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data = data.subspan(std::size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) throw error(errc::timeout, who + ": timed out sending");
      continue;
    }
    throw error(errc::peer_failure, who + ": connection lost while sending: " + errno_text(errno));
  }
}

/// Reads exactly data.size() bytes before the deadline (non-blocking socket; with TLS,
/// decrypted and authenticated).
inline void read_all(ring_io io, std::span<std::byte> data, ring_clock::time_point deadline, const std::string& who) {
  if (io.tls) {
    while (!data.empty()) {
      auto st = ring_tls::io::ok;
      const std::size_t n = io.tls->read_some(io.fd, data.data(), data.size(), st);
      if (n > 0) {
        data = data.subspan(n);
        continue;
      }
      if (st == ring_tls::io::closed) throw error(errc::peer_failure, who + ": connection closed by the peer");
      if (st == ring_tls::io::failed)
        throw error(errc::peer_failure, who + ": connection lost while receiving: " + io.tls->failure());
      if (!wait_fd(io.fd, POLLIN, deadline)) throw error(errc::timeout, who + ": timed out waiting for data");
    }
    return;
  }
  const int fd = io.fd;
  while (!data.empty()) {
    const ssize_t n = ::recv(fd, data.data(), data.size(), 0);
    if (n > 0) {
      data = data.subspan(std::size_t(n));
      continue;
    }
    if (n == 0) throw error(errc::peer_failure, who + ": connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline)) throw error(errc::timeout, who + ": timed out waiting for data");
      continue;
    }
    throw error(errc::peer_failure, who + ": connection lost while receiving: " + errno_text(errno));
  }
}

/// Accepts one connection before the deadline (listening socket is non-blocking).
inline unique_fd accept_one(int listener, ring_clock::time_point deadline, const std::string& what) {
  for (;;) {
    sockaddr_storage s{};
    socklen_t len = sizeof s;
    unique_fd fd(::accept4(listener, reinterpret_cast<sockaddr*>(&s), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd) return fd;
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      // The connection stays in the backlog: pause (bounded) rather than fail or spin.
      if (ring_clock::now() >= deadline)
        throw error(errc::timeout, "timed out waiting for " + what + " to connect (accept: " + errno_text(errno) + ")");
      pollfd none{-1, 0, 0};
      ::poll(&none, 1, std::min(remaining_ms(deadline), 100));
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) throw error(errc::io_error, "accept: " + errno_text(errno));
    if (!wait_fd(listener, POLLIN, deadline)) throw error(errc::timeout, "timed out waiting for " + what + " to connect");
  }
}

}  // namespace dtf::detail
