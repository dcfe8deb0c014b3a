// dtf/detail/ring_handshake.hpp — the first exchanges on a new collective connection, over
// dtf/detail/ring_socket.hpp's bounded reads and writes: the TLS handshake when TLS is on
// (dtf/detail/ring_tls.hpp; a plain client of a TLS port is refused in a frame it can read)
// and the dtf handshake (protocol version, cluster id, identity, HMAC-SHA256 mutual
// authentication when a secret is set; the machine is dtf/transport/handshake.hpp's), plus the
// small control frames the rendezvous exchanges. The handshake speaks exactly the frames of
// dtf/transport.hpp (hello, challenge, auth, welcome, refused), so a ring port refuses a
// stranger, a peer of another cluster or one without the secret the same way a ps does.
#pragma once

#include <dtf/detail/frame.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/detail/ring_socket.hpp>
#include <dtf/detail/ring_tls.hpp>
#include <dtf/error.hpp>
#include <dtf/transport/handshake.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dtf::detail {

/// One small frame (header + control message, no payload).
inline void write_control(ring_io fd, message_kind kind, const std::vector<std::byte>& meta,
                          ring_clock::time_point deadline, const std::string& who) {
  frame_header h;
  h.kind = kind;
  h.meta_size = std::uint32_t(meta.size());
  const auto header = encode_header(h);
  std::vector<std::byte> out(header.begin(), header.end());
  out.insert(out.end(), meta.begin(), meta.end());
  write_all(fd, out, deadline, who);
}

inline std::pair<frame_header, std::vector<std::byte>> read_control(ring_io fd, ring_clock::time_point deadline,
                                                                    const std::string& who) {
  std::array<std::byte, frame_header_size> hb{};
  read_all(fd, hb, deadline, who);
  frame_header h;
  try {
    h = decode_header(hb, frame_limits{});
  } catch (const error& e) {
    throw error(errc::peer_failure, who + ": malformed frame: " + e.message());
  }
  if (h.payload_size != 0) throw error(errc::peer_failure, who + ": control frame with a payload");
  std::vector<std::byte> meta(h.meta_size);
  read_all(fd, meta, deadline, who);
  return {h, std::move(meta)};
}

struct handshake_identity {
  std::string cluster_id, identity, secret;
};

/// Runs the handshake machine (dtf/transport/handshake.hpp) over a non-blocking socket until it
/// ends or the deadline passes; a refusal is sent (best effort) before the error is thrown.
inline handshake run_handshake(ring_io fd, handshake::role role, const handshake_identity& me,
                               ring_clock::time_point deadline, const std::string& who) {
  handshake h(role, {me.cluster_id, me.identity, me.secret});
  std::vector<std::byte> in;
  for (;;) {
    const auto out = h.take_output();
    if (!out.empty()) {
      try {
        write_all(fd, out, deadline, who);
      } catch (const error&) {
        if (h.status() != handshake::state::failed) throw;
      }
    }
    if (h.status() == handshake::state::done) return h;
    if (h.status() == handshake::state::failed) {
      const std::string peer = h.peer_identity().empty() ? "" : " ('" + h.peer_identity() + "')";
      throw error(errc::peer_failure, who + peer + ": " + h.failure());
    }
    in.resize(h.bytes_wanted());
    read_all(fd, in, deadline, who);
    h.receive(in);
  }
}

/// Client side of the dtf handshake. Throws errc::peer_failure when the server refuses or fails
/// to authenticate itself, errc::timeout at the deadline.
inline void client_handshake(ring_io fd, const handshake_identity& me, ring_clock::time_point deadline,
                             const std::string& who) {
  run_handshake(fd, handshake::role::client, me, deadline, who);
}

/// Server side of the dtf handshake on an accepted connection. Returns the identity the
/// client presented (unescaped: compare it, do not log it); throws errc::peer_failure (after
/// telling the client why, best effort) when it speaks another protocol, belongs to another
/// cluster or fails authentication.
inline std::string server_handshake(ring_io fd, const handshake_identity& me, ring_clock::time_point deadline,
                                    const std::string& who) {
  return run_handshake(fd, handshake::role::server, me, deadline, who).peer_identity_raw();
}

/// The TLS handshake on a new connection (`tls` fresh, in the role of this end) before the
/// deadline. Errors: errc::peer_failure naming the cause (tls_failure_reason: a peer without TLS,
/// another secret or cluster id), errc::timeout at the deadline.
inline void tls_handshake(int fd, ring_tls& tls, ring_clock::time_point deadline, const std::string& who) {
  for (;;) {
    const auto st = tls.handshake();
    try {
      flush_tls(fd, tls, deadline, who);  // (a failure's alert too: it tells the peer why)
    } catch (const error&) {
      if (st != tls_channel::status::failed) throw;
    }
    if (st == tls_channel::status::done) return;
    if (st != tls_channel::status::want_read) throw error(errc::peer_failure, who + ": " + tls.failure());
    for (;;) {
      const auto got = tls.fill(fd);
      if (got == ring_tls::io::ok) break;
      if (got == ring_tls::io::closed)
        throw error(errc::peer_failure, who + ": " + tls_failure_reason(0, ""));
      if (got == ring_tls::io::failed)
        throw error(errc::peer_failure, who + ": connection lost in the TLS handshake: " + tls.failure() + " (" +
                                            tls_failure_reason(0, "") + ")");
      if (!wait_fd(fd, POLLIN, deadline)) throw error(errc::timeout, who + ": timed out in the TLS handshake");
    }
  }
}

/// Reads and drops what a connection about to be refused or dropped has sent (bounded), so
/// that closing it sends a FIN after the refusal rather than a reset, which could discard the
/// refusal at the peer before it reads it.
inline void drain_before_close(int fd) {
  std::array<std::byte, 4096> buf;
  for (int i = 0; i < 16; ++i) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    break;
  }
}

/// What a TLS server logs when a client without TLS is refused.
inline constexpr const char* tls_refused_plain_peer =
    "refused: a peer without TLS (this task requires TLS: turn it on for every task or none)";

/// Server side of a new connection before the dtf handshake: with TLS (`ctx` not null), a
/// client whose first byte is not a TLS handshake record gets tls_required_refusal in a plain
/// dtf frame and errc::peer_failure (tls_refused_plain_peer) is thrown; otherwise the TLS
/// handshake runs. Without TLS nothing happens (the dtf handshake names a TLS client).
inline ring_connection accept_tls(unique_fd fd, SSL_CTX* ctx, ring_clock::time_point deadline, const std::string& who) {
  ring_connection c{std::move(fd), nullptr};
  if (!ctx) return c;
  unsigned char first = 0;
  for (;;) {
    const ssize_t n = ::recv(c.get(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 1) break;
    if (n == 0) throw error(errc::peer_failure, who + ": connection closed before the handshake");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw error(errc::peer_failure, who + ": connection lost before the handshake: " + errno_text(errno));
    if (!wait_fd(c.get(), POLLIN, deadline)) throw error(errc::timeout, who + ": timed out waiting for a handshake");
  }
  if (first != tls_handshake_record) {
    try {
      drain_before_close(c.get());
      write_all(c.get(), refusal_frame(tls_required_refusal),
                std::min(deadline, ring_clock::now() + std::chrono::milliseconds(100)), who);
    } catch (const error&) {
    }
    throw error(errc::peer_failure, who + ": " + tls_refused_plain_peer);
  }
  c.tls = std::make_unique<ring_tls>(ctx, tls_role::server);
  tls_handshake(c.get(), *c.tls, deadline, who);
  return c;
}

/// Client side: the TLS handshake (when `ctx` is not null) over a connected socket.
inline ring_connection connect_tls(unique_fd fd, SSL_CTX* ctx, ring_clock::time_point deadline, const std::string& who) {
  ring_connection c{std::move(fd), nullptr};
  if (!ctx) return c;
  c.tls = std::make_unique<ring_tls>(ctx, tls_role::client);
  tls_handshake(c.get(), *c.tls, deadline, who);
  return c;
}

}  // namespace dtf::detail
