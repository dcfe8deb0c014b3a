// dtf/detail/ring_acceptor.hpp — accepts a rank's expected neighbours on its listening socket,
// running the handshakes of every connection that has arrived at once (one poll() loop over
// the listener and each half-finished handshake): with TLS on, the TLS handshake first
// (dtf/detail/ring_tls.hpp) and the dtf handshake inside it.
//
// Why concurrent: handshaking one connection at a time lets a single silent socket on a
// rank's port (a port scanner, a stuck peer) stall the whole ring's set-up until the set-up
// deadline. Here a connection that says nothing only holds its own slot, for at most
// handshake_timeout_ms; accept failures such as EMFILE pause the listener (10 ms doubling to
// 1 s) instead of spinning.
//
// Why two caps, and why over-cap connections are closed rather than left in the backlog: at
// most max_pending connections handshake at once, and at most max_pending_per_source of them
// from one remote address (any port), so that a stranger on one host cannot take every slot.
// The job's own hosts (own_sources: the hosts of the ranks' addresses) have max_pending slots
// of their own, so strangers connecting from other addresses cannot hold the ranks out; a
// stranger on a rank's host shares that host's slots, up to max_pending_per_source.
// A connection over either cap is accepted and closed at once (the reason kept for the error):
// left in the backlog, strangers would fill it and the kernel would drop a real rank's SYNs
// (retried after 1 s, 3 s, ...). The connecting side tries again when it is closed before any
// answer (connect_and_handshake, dtf/detail/ring_handshake.hpp), so a rank gets in once a slot
// frees.
//
// Modes: with TLS on, a connection whose first byte is not a TLS handshake record is told
// tls_required_refusal in a plain dtf frame and dropped; without TLS, the dtf handshake
// recognises a TLS ClientHello and refuses it by name, answering a frame the client's TLS layer
// fails on (so that it does not take the close for a crowded port). Either way the reason is
// kept.
//
// Errors: errc::timeout naming the first neighbour that never completed a handshake, with the
// last refusal seen meanwhile (peer text escaped); errc::io_error for poll/accept faults other
// than running out of descriptors or memory.
#pragma once

#include <dtf/detail/ring_handshake.hpp>
#include <dtf/detail/ring_socket.hpp>
#include <dtf/detail/ring_tls.hpp>
#include <dtf/transport/cluster_hosts.hpp>
#include <dtf/transport/handshake.hpp>
#include <dtf/transport/tls.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dtf::detail {

/// How long an acceptor keeps answering after its caller gave up (see accept_neighbours).
inline constexpr int ring_accept_grace_ms = 1000;

/// Connections an acceptor takes off the backlog in one pass (then it serves the handshakes).
inline constexpr std::size_t ring_accept_batch = 64;

struct ring_accept_limits {
  std::uint32_t handshake_timeout_ms = 2000;  ///< per connection, from its accept
  std::size_t max_pending = 64;               ///< handshakes in progress at once (own hosts, others: each)
  std::size_t max_pending_per_source = 8;     ///< of those, from one remote address (any port)
  std::set<std::string> own_sources;          ///< the job's hosts (transport::resolve_cluster_hosts)
};

/// Accepts one connection for each of `expected` (identities, matched exactly) on the
/// non-blocking `listener`; returns them in the order of `expected`. Strangers, peers of
/// another cluster and unexpected identities are refused and counted in `refused`, and so are
/// connections closed at accept over a cap of `limits`.
/// `tls`: the server context with TLS on, null without. `cancel_fd` (-1: none): a descriptor
/// that becomes readable when the caller gives up (its own connections failed): the deadline
/// then moves to at most ring_accept_grace_ms later, so that a neighbour still handshaking is
/// told why it is refused (another mode, another secret) rather than finding the port gone,
/// and the set-up ends soon instead of at connect_timeout_ms.
inline std::vector<ring_connection> accept_neighbours(int listener, const handshake_identity& me,
                                                      const std::vector<std::string>& expected,
                                                      ring_clock::time_point deadline, const ring_accept_limits& limits,
                                                      std::size_t* refused = nullptr, SSL_CTX* tls = nullptr,
                                                      int cancel_fd = -1) {
  using namespace std::chrono;
  struct pending {
    unique_fd fd;
    handshake hs;
    ring_clock::time_point deadline;
    std::string remote;
    std::string source;             // the remote address without its port (max_pending_per_source)
    std::unique_ptr<ring_tls> tls;  // with TLS, once the first byte was a TLS record
    bool tls_up = false;             // the TLS handshake is done: the dtf one runs inside it
  };
  std::vector<ring_connection> out(expected.size());
  std::vector<pending> conns;
  std::string last;
  std::size_t filled = 0;
  ring_clock::time_point listener_paused_until{};
  milliseconds pause{0};
  const auto note = [&](std::string why) {
    last = std::move(why);
    if (refused) ++*refused;
  };
  // Sends the machine's output (a few hundred bytes at most: the socket buffer takes it).
  const auto flush = [&](pending& p) {
    const auto bytes = p.hs.take_output();
    if (bytes.empty()) return true;
    try {
      write_all(ring_io(p.fd.get(), p.tls.get()), bytes, std::min(p.deadline, ring_clock::now() + milliseconds(100)),
                p.remote);
      return true;
    } catch (const error&) {
      return false;
    }
  };
  // Advances connection p on readable bytes; true when it is finished (handed over or dropped).
  const auto step = [&](pending& p) -> bool {
    if (tls && !p.tls) {
      unsigned char first = 0;
      const ssize_t n = ::recv(p.fd.get(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
      if (n <= 0) {
        note(p.remote + ": closed during the handshake");
        return true;
      }
      if (first != tls_handshake_record) {
        try {
          drain_before_close(p.fd.get());
          write_all(p.fd.get(), refusal_frame(tls_required_refusal),
                    std::min(p.deadline, ring_clock::now() + milliseconds(100)), p.remote);
        } catch (const error&) {
        }
        note(p.remote + ": " + tls_refused_plain_peer);
        return true;
      }
      p.tls = std::make_unique<ring_tls>(tls, tls_role::server);
    }
    if (p.tls && !p.tls_up) {
      const auto got = p.tls->fill(p.fd.get());
      if (got == ring_tls::io::would_block) return false;
      if (got != ring_tls::io::ok) {
        note(p.remote + ": " + (got == ring_tls::io::closed ? tls_failure_reason(0, "") : p.tls->failure()));
        return true;
      }
      const auto st = p.tls->handshake();
      const bool sent = p.tls->send_some(p.fd.get()) != ring_tls::io::failed && p.tls->unsent() == 0;
      if (st == tls_channel::status::want_read && !sent) {
        note(p.remote + ": connection lost in the TLS handshake");
        return true;
      }
      if (st == tls_channel::status::want_read) return false;
      if (st != tls_channel::status::done) {
        note(p.remote + ": " + p.tls->failure());
        return true;
      }
      p.tls_up = true;  // the client's first dtf bytes may have come with its Finished: read on
    }
    for (;;) {
      std::array<std::byte, 512> buf;
      const std::size_t want = std::min(buf.size(), p.hs.bytes_wanted());
      std::size_t n = 0;
      if (p.tls) {
        auto st = ring_tls::io::ok;
        n = p.tls->read_some(p.fd.get(), buf.data(), want, st);
        if (st == ring_tls::io::would_block) return false;
        if (st != ring_tls::io::ok) {
          note(p.remote + ": " + (st == ring_tls::io::closed ? "closed during the handshake" : p.tls->failure()));
          return true;
        }
      } else {
        const ssize_t got = ::recv(p.fd.get(), buf.data(), want, MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
        if (got <= 0) {
          note(p.remote + ": closed during the handshake");
          return true;
        }
        n = std::size_t(got);
      }
      p.hs.receive(std::span<const std::byte>(buf.data(), n));
      const bool sent = flush(p);
      if (p.hs.status() == handshake::state::failed) {
        // (A TLS client's refusal went out in the flush above, in a plain frame: a byte back
        // lets it tell this refusal from a port that closes connections unanswered.)
        note(p.remote + (p.hs.peer_identity().empty() ? "" : " ('" + p.hs.peer_identity() + "')") + ": " +
             p.hs.failure());
        return true;
      }
      if (!sent) {
        note(p.remote + ": connection lost during the handshake");
        return true;
      }
      if (p.hs.status() == handshake::state::done) {
        std::size_t slot = 0;
        while (slot < expected.size() && (out[slot] || expected[slot] != p.hs.peer_identity_raw())) ++slot;
        if (slot == expected.size()) {
          note("'" + p.hs.peer_identity() + "' connected, not an expected neighbour of '" + printable(me.identity) + "'");
        } else {
          out[slot] = ring_connection{std::move(p.fd), std::move(p.tls)};
          ++filled;
        }
        return true;
      }
    }
  };
  while (filled < expected.size()) {
    const auto now = ring_clock::now();
    // Expired handshakes go first: they must not hold slots.
    for (auto it = conns.begin(); it != conns.end();) {
      if (now >= it->deadline) {
        note(it->remote + (it->hs.peer_identity().empty() ? "" : " ('" + it->hs.peer_identity() + "')") +
             ": did not complete the handshake within " + std::to_string(limits.handshake_timeout_ms) + " ms");
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
    if (now >= deadline) {
      std::size_t missing = 0;
      while (out[missing]) ++missing;
      throw error(errc::timeout, "timed out waiting for '" + expected[missing] + "' to connect" +
                                     (last.empty() ? "" : " (refused meanwhile: " + last + ")"));
    }
    std::vector<pollfd> fds;
    // The listener is polled even when every slot is taken: connections over a cap are closed
    // at once rather than left in the backlog (see the top of this file).
    const bool listen_now = now >= listener_paused_until;
    if (listen_now) fds.push_back({listener, POLLIN, 0});
    for (auto& p : conns) fds.push_back({p.fd.get(), POLLIN, 0});
    if (cancel_fd >= 0) fds.push_back({cancel_fd, POLLIN, 0});  // last: the connections' indices stay as they are
    auto wake = deadline;
    for (auto& p : conns) wake = std::min(wake, p.deadline);
    if (!listen_now) wake = std::min(wake, listener_paused_until);
    const int rc = ::poll(fds.data(), nfds_t(fds.size()), remaining_ms(wake) + (wake > now ? 1 : 0));
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw error(errc::io_error, "poll: " + errno_text(errno));
    }
    if (cancel_fd >= 0 && fds.back().revents != 0) {
      deadline = std::min(deadline, ring_clock::now() + milliseconds(ring_accept_grace_ms));
      cancel_fd = -1;
    }
    const std::size_t polled = conns.size();  // the connections fds has entries for
    std::size_t first_conn = 0;
    if (listen_now) {
      first_conn = 1;
      for (std::size_t taken = 0; fds[0].revents != 0 && taken < ring_accept_batch; ++taken) {
        sockaddr_storage s{};
        socklen_t len = sizeof s;
        unique_fd fd(::accept4(listener, reinterpret_cast<sockaddr*>(&s), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            pause = std::clamp(pause * 2, milliseconds(10), milliseconds(1000));
            listener_paused_until = ring_clock::now() + pause;
            note("accept: " + errno_text(errno) + " (pausing " + std::to_string(pause.count()) + " ms)");
            break;
          }
          throw error(errc::io_error, "accept: " + errno_text(errno));
        }
        pause = milliseconds(0);
        std::string remote = address_text(s);
        std::string source = transport::normalised_source(remote.substr(0, remote.rfind(':')));
        // Over a cap: closed at once (fd goes out of scope); the client tries again. The job's
        // hosts and everyone else have max_pending each.
        const bool own = limits.own_sources.count(source) > 0;
        const auto same_side = [&](const pending& p) { return (limits.own_sources.count(p.source) > 0) == own; };
        if (std::size_t(std::count_if(conns.begin(), conns.end(), same_side)) >= limits.max_pending) {
          note(remote + ": refused, " + std::to_string(limits.max_pending) + " handshakes" +
               (own ? " from the job's hosts" : "") + " already in progress (max_pending_connections)");
          continue;
        }
        const auto same_source = [&](const pending& p) { return p.source == source; };
        if (std::size_t(std::count_if(conns.begin(), conns.end(), same_source)) >= limits.max_pending_per_source) {
          note(remote + ": refused, " + std::to_string(limits.max_pending_per_source) + " handshakes from " + source +
               " already in progress (max_pending_per_source)");
          continue;
        }
        conns.push_back(pending{std::move(fd), handshake(handshake::role::server, {me.cluster_id, me.identity, me.secret}),
                                std::min(deadline, ring_clock::now() + milliseconds(limits.handshake_timeout_ms)),
                                std::move(remote), std::move(source), nullptr, false});
      }
    }
    // Feed each connection that has bytes; a connection sees only its own bytes, so a silent
    // one delays nobody.
    std::vector<bool> finished(conns.size(), false);
    for (std::size_t i = 0; i < polled; ++i)
      if (fds[first_conn + i].revents != 0) finished[i] = step(conns[i]);
    for (std::size_t i = conns.size(); i-- > 0;) {
      if (!finished[i]) continue;
      if (conns[i].fd) drain_before_close(conns[i].fd.get());  // refused or dropped (not handed over)
      conns.erase(conns.begin() + std::ptrdiff_t(i));
    }
  }
  return out;
}

}  // namespace dtf::detail
