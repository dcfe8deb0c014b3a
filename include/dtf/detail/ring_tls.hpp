// dtf/detail/ring_tls.hpp — TLS 1.3 on one of the collectives' POSIX sockets
// (collective_options::tls): the request/reply transport's machine (tls_channel, with the key and
// SSL_CTX settings of dtf/transport/tls.hpp) driven by non-blocking send() and recv().
//
// Why a layer of its own rather than a TLS stream type: the ring engine
// (dtf/detail/ring_engine.hpp) sends and receives on one thread with non-blocking calls and
// poll(), full duplex; it needs steps that never block ("encrypt this much", "send what you
// can", "decrypt what has arrived") and a way to know that nothing is buffered before it
// sleeps in poll(). The blocking forms with deadlines (the set-up) are in
// dtf/detail/ring_socket.hpp and dtf/detail/ring_handshake.hpp, built on these.
//
// Memory: ciphertext to send is what one encrypt() produced plus what the socket has not taken
// yet (the engine encrypts ahead at most ring_tls_encrypt_chunk bytes); ciphertext received is
// at most one read buffer plus a partial record, since recv() runs only when OpenSSL has no
// whole record left. A peer cannot make this grow: TLS records are at most 16 KiB.
//
// Thread safety: one object per connection, used by one thread at a time.
#pragma once

#include <dtf/error.hpp>
#include <dtf/transport/tls.hpp>

#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace dtf::detail {

/// Ciphertext bytes one recv() takes at most during set-up (handshakes) and on a data link.
inline constexpr std::size_t ring_tls_handshake_buffer = std::size_t(16) << 10;
inline constexpr std::size_t ring_tls_data_buffer = std::size_t(256) << 10;
/// Plaintext bytes the engine encrypts at once, ahead of the socket.
inline constexpr std::size_t ring_tls_encrypt_chunk = std::size_t(256) << 10;

/// The TLS layer of one connected, non-blocking socket.
class ring_tls {
 public:
  /// What a non-blocking step did.
  enum class io {
    ok,           ///< bytes moved
    would_block,  ///< nothing to do until the socket is ready (poll it)
    closed,       ///< the peer closed the connection
    failed,       ///< a socket error or a TLS failure (failure() says which)
  };

  ring_tls(SSL_CTX* ctx, tls_role role, std::size_t read_buffer = ring_tls_handshake_buffer)
      : channel_(ctx, role), in_(read_buffer) {}
  ring_tls(const ring_tls&) = delete;
  ring_tls& operator=(const ring_tls&) = delete;

  /// A larger receive buffer once the connection carries data.
  void set_read_buffer(std::size_t bytes) { in_.resize(bytes); }

  /// Advances the TLS handshake (tls_channel::handshake); send its output with send_some after
  /// it whatever it returns.
  tls_channel::status handshake() {
    const auto st = channel_.handshake();
    if (st == tls_channel::status::failed) failure_ = tls_channel_failure_text(channel_.failure_code());
    if (st == tls_channel::status::closed) failure_ = "the peer closed the connection in the TLS handshake";
    return st;
  }

  /// Ciphertext produced and not yet taken by the socket.
  std::size_t unsent() const noexcept { return channel_.output().size() - sent_; }

  /// Encrypts `n` plaintext bytes into the ciphertext to send. False on a TLS failure.
  bool encrypt(const void* data, std::size_t n) {
    if (channel_.write(data, n)) return true;
    failure_ = "TLS: " + channel_.failure_code().message();
    return false;
  }

  /// Sends unsent ciphertext without blocking (`flags`: MSG_MORE or 0). ok when some or all of
  /// it left (or there was none), would_block, failed on a socket error.
  io send_some(int fd, int flags = 0) {
    for (;;) {
      const auto out = channel_.output();
      if (sent_ == out.size()) return io::ok;
      const ssize_t n = ::send(fd, out.data() + sent_, out.size() - sent_, MSG_NOSIGNAL | MSG_DONTWAIT | flags);
      if (n > 0) {
        sent_ += std::size_t(n);
        if (sent_ == out.size()) {
          channel_.consume_output();
          sent_ = 0;
        }
        return io::ok;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return io::would_block;
      failure_ = std::strerror(errno);
      return io::failed;
    }
  }

  /// Receives ciphertext (one recv()) into the TLS machine: ok, would_block, closed (end of
  /// stream) or failed (socket error).
  io fill(int fd) {
    for (;;) {
      const ssize_t n = ::recv(fd, in_.data(), in_.size(), MSG_DONTWAIT);
      if (n > 0) {
        channel_.feed(in_.data(), std::size_t(n));
        return io::ok;
      }
      if (n == 0) {
        failure_ = "the peer closed the connection";
        return io::closed;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return io::would_block;
      failure_ = std::strerror(errno);
      return io::failed;
    }
  }

  /// Decrypts up to `n` bytes into `data` without blocking, receiving ciphertext from `fd` when
  /// the machine holds no whole record. Returns the bytes decrypted (> 0 with st == ok), or 0
  /// with st saying why: would_block means nothing is buffered here either, so poll() may sleep.
  std::size_t read_some(int fd, void* data, std::size_t n, io& st) {
    for (;;) {
      auto s = tls_channel::status::want_read;
      const std::size_t got = channel_.read(data, n, s);
      if (got > 0) {
        st = io::ok;
        return got;
      }
      if (s == tls_channel::status::closed) {
        failure_ = "the peer ended its TLS session";
        st = io::closed;
        return 0;
      }
      if (s == tls_channel::status::failed) {
        failure_ = "TLS: " + channel_.failure_code().message() +
                   " (a record failed authentication or the stream is not TLS: modified, injected or dropped bytes)";
        st = io::failed;
        return 0;
      }
      st = fill(fd);
      if (st != io::ok) return 0;
    }
  }

  /// Why the last step that failed or saw the connection close did so.
  const std::string& failure() const noexcept { return failure_; }

 private:
  tls_channel channel_;
  std::size_t sent_ = 0;  // bytes of channel_.output() the socket has taken
  std::vector<std::byte> in_;
  std::string failure_;
};

}  // namespace dtf::detail
