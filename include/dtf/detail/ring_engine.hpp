// dtf/detail/ring_engine.hpp — runs a ring schedule (dtf/detail/ring_schedule.hpp) on the
// calling thread: non-blocking send() to the right neighbour and recv() from the left one in
// one loop, reducing each segment as soon as it has arrived, so that sending, receiving and
// reducing overlap without any hand-off to another thread.
//
// Why the calling thread: on a 2-core machine a thread that blocks waiting for an I/O thread
// can lose a whole 4 ms scheduler tick (DESIGN.md §9). The loop instead retries the sockets,
// yielding the core between attempts, for up to spin_us before it blocks in poll().
//
// With TLS (collective_options::tls) a link's connections carry a TLS layer
// (dtf/detail/ring_tls.hpp): the loop encrypts up to ring_tls_encrypt_chunk bytes ahead of the
// socket and sends the records, and decrypts what arrives straight into the receive buffer;
// it sleeps in poll() only when the TLS layer holds no whole record either, and returns only
// once every record of the collective has left. Without TLS the only cost is one null test
// per system call.
#pragma once

#include <dtf/detail/ring_schedule.hpp>
#include <dtf/detail/ring_socket.hpp>
#include <dtf/detail/ring_tls.hpp>
#include <dtf/error.hpp>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace dtf::detail {

/// The segment size the engine uses for `segment_bytes`: a multiple of 64 bytes (whole
/// elements of every dtype), at least 64.
inline std::size_t ring_segment(std::size_t segment_bytes) { return std::max<std::size_t>(64, segment_bytes / 64 * 64); }

struct ring_link {
  int right = -1, left = -1;           ///< send to right, receive from left
  std::string right_name, left_name;   ///< "rank 1 (worker.1 at 127.0.0.1:2223)"
  std::uint32_t timeout_ms = 30000;    ///< longest time without progress
  std::uint32_t spin_us = 20;          ///< retry without blocking this long before poll()
  std::size_t segment_bytes = 1 << 18;  ///< reduction granularity (a multiple of 8)
  ring_tls* right_tls = nullptr;        ///< the TLS layers of right and left (null: plain;
  ring_tls* left_tls = nullptr;         ///< the same object when right == left)
};

/// Runs `steps` in order. `context` (e.g. "allreduce of 'w' (…)") prefixes errors.
/// Errors: errc::peer_failure when a neighbour closes or resets its connection, errc::timeout
/// when no byte moves within timeout_ms, and whatever an on_received hook throws; each names
/// the neighbour. After an error the connections are in an undefined state: close them.
inline void run_ring(const ring_link& link, std::vector<ring_step>& steps, reduce_fn reduce, scale_fn scale,
                     const std::string& context) {
  using clock = ring_clock;
  const std::size_t total = steps.size();
  std::size_t ss = 0, so = 0;         // send step, bytes of it sent
  std::size_t rs = 0, ro = 0, ru = 0;  // recv step, bytes of it received, bytes of it final (reduced)
  const std::size_t seg = ring_segment(link.segment_bytes);
  auto last_progress = clock::now();
  auto spin_start = last_progress;
  bool spinning = false;

  const auto final_bytes = [&](std::size_t step) -> std::size_t {
    if (step < rs) return steps[step].recv_bytes;
    if (step == rs) return ru;
    return 0;
  };

  for (;;) {
    // Retire finished steps (empty ones included) on both sides.
    while (rs < total && ro == steps[rs].recv_bytes) {
      if (steps[rs].on_received) steps[rs].on_received();
      ++rs;
      ro = ru = 0;
    }
    while (ss < total && so == steps[ss].send_bytes) {
      ++ss;
      so = 0;
    }
    if (ss == total && rs == total && (!link.right_tls || link.right_tls->unsent() == 0)) return;

    bool progress = false;
    bool want_send = false;
    bool hold = false;  // TLS: keep a header's record until its data's records join it
    if (ss < total) {
      const ring_step& s = steps[ss];
      const std::size_t allowed = (s.gated && ss > 0) ? std::min(s.send_bytes, final_bytes(ss - 1)) : s.send_bytes;
      if (allowed > so) {
        want_send = true;
        // A header followed at once by its data goes out as one segment: cork it (MSG_MORE
        // overrides TCP_NODELAY for this call) instead of waking the receiver twice.
        const bool more = allowed == s.send_bytes && ss + 1 < total && steps[ss + 1].send_bytes > 0 &&
                          !steps[ss + 1].gated;
        if (link.right_tls) {
          if (link.right_tls->unsent() < ring_tls_encrypt_chunk) {
            const std::size_t n = std::min(allowed - so, ring_tls_encrypt_chunk);
            if (!link.right_tls->encrypt(s.send + so, n))
              throw error(errc::peer_failure, context + ": connection to " + link.right_name + ": " +
                                                  link.right_tls->failure());
            so += n;
            progress = true;
            hold = more && so == s.send_bytes;
          }
        } else {
          const ssize_t n =
              ::send(link.right, s.send + so, allowed - so, MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0));
          if (n > 0) {
            so += std::size_t(n);
            progress = true;
          } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            throw error(errc::peer_failure, context + ": connection to " + link.right_name +
                                                " lost while sending: " + errno_text(errno));
          }
        }
      }
    }
    if (link.right_tls && link.right_tls->unsent() > 0 && !hold) {
      switch (link.right_tls->send_some(link.right)) {
        case ring_tls::io::ok:
          progress = true;
          break;
        case ring_tls::io::would_block:
          want_send = true;
          break;
        default:
          throw error(errc::peer_failure, context + ": connection to " + link.right_name +
                                              " lost while sending: " + link.right_tls->failure());
      }
    }
    if (rs < total) {
      ring_step& r = steps[rs];
      // A windowed reduce step receives into a ring of two segments, reused while it is
      // still in cache: bytes land at (offset mod window), never past the window's end nor
      // over bytes not reduced yet. Segment-aligned reductions then never wrap.
      std::byte* at = r.recv + ro;
      std::size_t want = r.recv_bytes - ro;
      if (r.windowed) {
        const std::size_t window = 2 * seg, slot = ro % window;
        at = r.recv + slot;
        want = std::min({want, window - slot, ru + window - ro});
      }
      ssize_t n = 0;
      if (link.left_tls) {
        auto st = ring_tls::io::ok;
        n = ssize_t(link.left_tls->read_some(link.left, at, want, st));
        if (st == ring_tls::io::failed)
          throw error(errc::peer_failure, context + ": connection from " + link.left_name +
                                              " lost while receiving: " + link.left_tls->failure());
        if (st == ring_tls::io::would_block) {
          n = -1;
          errno = EAGAIN;
        }
      } else {
        n = ::recv(link.left, at, want, MSG_DONTWAIT);
      }
      if (n > 0) {
        ro += std::size_t(n);
        progress = true;
        const std::size_t ready = ro == r.recv_bytes ? ro : ro / seg * seg;
        if (ready > ru) {
          if (r.reduce_into) {
            const std::byte* src = r.windowed ? r.recv + ru % (2 * seg) : r.recv + ru;
            reduce(r.reduce_into + ru, src, ready - ru);
            if (r.divide_by > 1) scale(r.reduce_into + ru, ready - ru, r.divide_by);
          }
          ru = ready;
        }
      } else if (n == 0) {
        throw error(errc::peer_failure, context + ": " + link.left_name +
                                            " closed the connection (it failed or exited; see its error)");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw error(errc::peer_failure, context + ": connection from " + link.left_name +
                                            " lost while receiving: " + errno_text(errno));
      }
    }
    if (progress) {
      last_progress = clock::now();
      spinning = false;
      continue;
    }
    const auto now = clock::now();
    if (!spinning) {
      spinning = true;
      spin_start = now;
    }
    if (now - spin_start < std::chrono::microseconds(link.spin_us)) {
      ::sched_yield();  // let a peer sharing this core run
      continue;
    }
    const auto deadline = last_progress + std::chrono::milliseconds(link.timeout_ms);
    if (now >= deadline) {
      const std::string& who = rs < total ? link.left_name : link.right_name;
      throw error(errc::timeout, context + ": no progress within " + std::to_string(link.timeout_ms) + " ms waiting for " +
                                     who + " (dead, hung, or not calling this collective)");
    }
    pollfd fds[2];
    nfds_t nfds = 0;
    if (rs < total) fds[nfds++] = pollfd{link.left, POLLIN, 0};
    if (want_send) fds[nfds++] = pollfd{link.right, POLLOUT, 0};  // (TLS: records that did not fit)
    const int rc = ::poll(fds, nfds, std::min(remaining_ms(deadline) + 1, 1000));
    if (rc < 0 && errno != EINTR) throw error(errc::io_error, context + ": poll: " + errno_text(errno));
    spinning = false;
  }
}

}  // namespace dtf::detail
