// dtf/transport/options.hpp — the knobs of a request/reply connection (dtf/transport.hpp) and
// the logging helpers both socket kinds share.
#pragma once

#include <dtf/detail/frame.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>
#include <utility>

namespace dtf {

/// Options of an rpc_client or rpc_server. Durations in milliseconds; 0 disables a deadline
/// only where said.
struct transport_options {
  std::string cluster_id;  ///< peers must present the same id (empty: not checked by a server)
  std::string identity;    ///< this task, e.g. "worker.0"
  /// The master secret (docs/design/identity.md): a server needs it to authenticate clients;
  /// a client derives its own key from it. Empty (with no task_key): no authentication.
  std::string secret;
  /// A client's own key K(identity) (dtf::derive_task_key), used when `secret` is empty: it
  /// can connect as `identity` only.
  std::string task_key;
  /// Every byte of every connection inside TLS 1.3 keyed by the secret (dtf/transport/tls.hpp);
  /// needs a secret. Both ends must agree: a peer in the other mode is refused with the reason.
  bool tls = false;
  std::uint32_t timeout_ms = 30000;            ///< a request's reply must arrive within this
  std::uint32_t connect_timeout_ms = 60000;    ///< keep retrying a peer that is not listening yet
  /// A new connection must finish the handshake within this (server: or it is dropped;
  /// client: or the attempt fails). Short, so that a silent stranger holds a slot briefly.
  std::uint32_t handshake_timeout_ms = 2000;
  /// Server: a frame, once started, must keep arriving: the longest wait for its next bytes.
  /// A peer that announces a frame and stalls is dropped after this, holding nothing.
  std::uint32_t frame_timeout_ms = 10000;
  /// Server: a reply must keep leaving: the longest a peer may leave it unread (no byte taken
  /// off the socket) before the connection ends and the buffers it pins (shard leases) are
  /// released. 0 waits forever.
  std::uint32_t write_timeout_ms = 10000;
  /// Server: an authenticated peer must start its next frame within this after the last one
  /// was answered (a request, or rpc_client::heartbeat()); 0 waits forever. A request whose
  /// reply the handler defers is not idle.
  std::uint32_t idle_timeout_ms = 600000;
  /// Server: at most this many authenticated connections at once; a peer that authenticates
  /// past it is disconnected with a logged reason (only holders of a credential get that far).
  /// Connections still in the handshake have budgets of their own.
  std::size_t max_connections = 1024;
  /// Server: at most this many connections in the handshake at once; the next ones are
  /// closed at accept (a client retries within connect_timeout_ms).
  std::size_t max_handshakes = 256;
  /// Server: at most this many of them from one IP address, so that one stranger's silent
  /// connections cannot take the whole handshake budget from the tasks.
  std::size_t max_handshakes_per_source = 32;
  /// Server: the cluster's task addresses ("host:port", as the cluster spec gives them; names
  /// are resolved when the server starts). Connections from their hosts have max_handshakes
  /// handshake slots of their own, which connections from other addresses cannot take, so a
  /// flood from strangers' addresses does not hold the tasks out (a stranger on a task's host,
  /// or behind the same NAT, shares that host's slots, up to max_handshakes_per_source).
  /// Empty: one budget for every connection. dtf::train sets it from the cluster.
  std::vector<std::string> cluster_hosts;
  /// Server: refusals at accept, dropped connections, requests refused unread and a ps's
  /// dropped stale synchronous contributions are logged at most once per this interval each,
  /// with the count of those not logged (0: every one), whether or not the peer authenticated
  /// (without a secret every peer does; with one, a task's key may be an insider's).
  std::uint32_t refusal_log_interval_ms = 1000;
  /// Server: the largest frame parts (control message, payload) a peer may send.
  detail::frame_limits limits{};
  /// Server: a request payload of at least this many bytes may be handed to a handler that
  /// offers it a piece at a time as it arrives (rpc_server, payload_pieces). A client marks
  /// what a server needs to take such a push (the ps client: whether its values are finite).
  std::size_t pieces_min_bytes = std::size_t(1) << 20;
  /// Client: a ps client cuts a ps's part of an init, pull, push, synchronous contribution or
  /// restore (from host or device memory) into requests of at most this many payload bytes
  /// (whole shards; a larger shard goes alone), so no frame and no buffer on either side grows
  /// with the model (docs/design/large-models.md).
  std::size_t max_request_bytes = std::size_t(64) << 20;
  /// CUDA builds: a ps client moves device memory through a pinned staging buffer in segments
  /// of this many bytes, copying one while the previous one is on the wire (CPU builds send in
  /// place and ignore it). Positive.
  std::size_t staging_segment_bytes = std::size_t(1) << 20;
  /// Where logged reasons go (a line without newline); default: stderr.
  std::function<void(const std::string&)> log{};
};

namespace detail {

inline void log_line(const transport_options& o, const std::string& line) {
  if (o.log) {
    o.log(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

/// Lets through one line per `period` and counts the others, so that a flood (a connection
/// storm, accept failing again and again) costs a line a second, not a disk: the first event
/// after a period is logged with the count of those not logged since the last line. Thread-safe.
class log_limiter {
 public:
  explicit log_limiter(std::chrono::milliseconds period = std::chrono::seconds(1)) : period_(period) {}
  /// Calls emit(suffix) when this line may be logged; the suffix names the suppressed lines
  /// ("" when none were).
  template <class Emit>
  void operator()(Emit emit) {
    counted([&](std::size_t suppressed) {
      emit(suppressed == 0 ? std::string() : " (" + std::to_string(suppressed) + " similar lines suppressed)");
    });
  }
  /// Calls emit(n) when this event may be logged, n the events not logged since the last line.
  template <class Emit>
  void counted(Emit emit) {
    std::size_t suppressed = 0;
    {
      std::lock_guard g(mu_);
      const auto now = std::chrono::steady_clock::now();
      if (now < next_) {
        ++suppressed_;
        return;
      }
      next_ = now + period_;
      suppressed = std::exchange(suppressed_, 0);
    }
    emit(suppressed);
  }

 private:
  std::mutex mu_;
  std::chrono::milliseconds period_;
  std::chrono::steady_clock::time_point next_{};
  std::size_t suppressed_ = 0;
};

}  // namespace detail
}  // namespace dtf
