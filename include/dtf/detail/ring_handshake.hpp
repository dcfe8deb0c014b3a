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

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtf::detail {

/// Thrown on the connecting side when the server closed or reset the connection before any
/// byte of its handshake came back: it gave no reason, so the caller may try again (an
/// acceptor over its caps closes connections this way, dtf/detail/ring_acceptor.hpp). A
/// refusal with a reason (another secret, cluster or TLS mode) is an ordinary dtf::error.
class closed_before_answer : public error {
 public:
  using error::error;
};

namespace ring_handshake_detail {
// `e`'s message without the leading "who: " the socket helpers put there.
inline std::string without_who(const error& e, const std::string& who) {
  const std::string& m = e.message();
  return m.rfind(who + ": ", 0) == 0 ? m.substr(who.size() + 2) : m;
}
}  // namespace ring_handshake_detail

/// Waits until the peer's first byte has arrived, without taking it. Errors:
/// closed_before_answer on end of stream or a reset, errc::timeout at the deadline.
inline void await_first_byte(int fd, ring_clock::time_point deadline, const std::string& who) {
  for (;;) {
    std::byte b{};
    const ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 1) return;
    if (n == 0)
      throw closed_before_answer(errc::peer_failure, who + ": closed the connection before answering the handshake");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw closed_before_answer(errc::peer_failure, who + ": closed the connection before answering the handshake (" +
                                                         errno_text(errno) + ")");
    if (!wait_fd(fd, POLLIN, deadline)) throw error(errc::timeout, who + ": timed out waiting for data");
  }
}

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
  // A plain client speaks first: until the server's first byte, a closed connection is one the
  // server answered nothing on (closed_before_answer). Under TLS the server has answered already.
  bool answered = fd.tls != nullptr || role == handshake::role::server;
  std::vector<std::byte> in;
  for (;;) {
    const auto out = h.take_output();
    if (!out.empty()) {
      try {
        write_all(fd, out, deadline, who);
      } catch (const error& e) {
        if (!answered && e.code() == errc::peer_failure)
          throw closed_before_answer(errc::peer_failure,
                                     who + ": closed the connection before answering the handshake (" +
                                         ring_handshake_detail::without_who(e, who) + ")");
        if (h.status() != handshake::state::failed) throw;
      }
    }
    if (h.status() == handshake::state::done) return h;
    if (h.status() == handshake::state::failed) {
      const std::string peer = h.peer_identity().empty() ? "" : " ('" + h.peer_identity() + "')";
      throw error(errc::peer_failure, who + peer + ": " + h.failure());
    }
    if (!answered) {
      await_first_byte(fd.fd, deadline, who);
      answered = true;
    }
    in.resize(h.bytes_wanted());
    read_all(fd, in, deadline, who);
    h.receive(in);
  }
}

/// Client side of the dtf handshake. Throws errc::peer_failure when the server refuses or fails
/// to authenticate itself (closed_before_answer when it closed the connection without a byte of
/// answer), errc::timeout at the deadline.
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
/// another secret or cluster id), closed_before_answer when the peer closed or reset the
/// connection before sending a byte, errc::timeout at the deadline.
inline void tls_handshake(int fd, ring_tls& tls, ring_clock::time_point deadline, const std::string& who) {
  bool heard = false;  // a byte came from the peer: from now on a close ends a started handshake
  const auto unanswered = [&](const std::string& detail) {
    return closed_before_answer(errc::peer_failure, who + ": closed the connection before answering the TLS handshake" +
                                                        (detail.empty() ? "" : " (" + detail + ")"));
  };
  for (;;) {
    const auto st = tls.handshake();
    try {
      flush_tls(fd, tls, deadline, who);  // (a failure's alert too: it tells the peer why)
    } catch (const error& e) {
      if (!heard && e.code() == errc::peer_failure) throw unanswered(ring_handshake_detail::without_who(e, who));
      if (st != tls_channel::status::failed) throw;
    }
    if (st == tls_channel::status::done) return;
    if (st != tls_channel::status::want_read) throw error(errc::peer_failure, who + ": " + tls.failure());
    for (;;) {
      const auto got = tls.fill(fd);
      if (got == ring_tls::io::ok) {
        heard = true;
        break;
      }
      if (!heard && got == ring_tls::io::closed) throw unanswered("");
      if (!heard && got == ring_tls::io::failed) throw unanswered(tls.failure());
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

/// A rank's connection to another rank's port (`who` names it in errors): connects, runs the
/// TLS handshake (when `ctx` is not null) and the dtf client handshake as `me`. A connection
/// the server closes before answering (closed_before_answer: its port is over a cap of
/// handshakes in progress, dtf/detail/ring_acceptor.hpp) is tried again after a pause of 5 ms
/// doubling to 200 ms, until the deadline, so that a rank whose neighbour's port is crowded by
/// strangers gets in once a slot frees. Errors: a refusal with a reason (another secret,
/// cluster id or TLS mode) at once, errc::peer_failure naming it; errc::timeout at the deadline,
/// saying that the peer kept closing connections before the handshake when it did.
inline ring_connection connect_and_handshake(const std::string& address, SSL_CTX* ctx, const handshake_identity& me,
                                             ring_clock::time_point deadline, const std::string& who) {
  auto backoff = std::chrono::milliseconds(5);
  std::size_t closed = 0;
  std::string last;
  const auto crowded = [&](const std::string& then) {
    return error(errc::timeout, who + " (" + address + "): kept closing the connection before the handshake (" +
                                    std::to_string(closed) + " tries until the set-up deadline): its port is " +
                                    "crowded by other connections, or it is not a dtf rank (last: " + last +
                                    (then.empty() ? "" : "; then: " + then) + ")");
  };
  for (;;) {
    try {
      ring_connection c = connect_tls(connect_with_retry(address, who, deadline), ctx, deadline, who);
      client_handshake(c, me, deadline, who);
      return c;
    } catch (const closed_before_answer& e) {
      ++closed;
      last = ring_handshake_detail::without_who(e, who);
    } catch (const error& e) {
      if (closed > 0 && e.code() == errc::timeout) throw crowded(ring_handshake_detail::without_who(e, who));
      throw;
    }
    if (ring_clock::now() + backoff >= deadline) throw crowded("");
    // Bounded pause before trying again: a slot frees when a handshake there ends or times out.
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace dtf::detail
