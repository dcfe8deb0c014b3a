// dtf/transport.hpp — request/reply messaging between tasks over TCP (standalone Asio).
//
// One connection per pair of tasks. A message is a frame (dtf/detail/frame.hpp): a fixed
// header, a small control message encoded with cereal, and a raw payload written and read
// with scatter/gather buffers straight from and into the caller's memory, so tensor bytes
// are never copied into an archive.
//
// A connection starts with the dtf handshake (dtf/transport/handshake.hpp, shared with the
// ring sockets of the collectives): protocol version, cluster id and identity; with a shared
// secret both sides prove knowledge of it by HMAC-SHA256 over fresh nonces. The handshake
// decides who may connect. By default the frames after it are neither encrypted nor
// authenticated; with transport_options::tls every byte of the connection, the handshake
// included, runs inside TLS 1.3 keyed by the cluster secret (dtf/transport/tls.hpp;
// docs/guides/security.md). Addresses are parsed by dtf/transport/address.hpp.
//
// A hostile or broken peer cannot stall or exhaust a server: at most max_handshakes connections
// in the handshake, max_handshakes_per_source of them from one address, and max_connections
// authenticated ones (more are closed, logged at most a line a second); a handshake within
// handshake_timeout_ms; a started frame that keeps arriving (frame_timeout_ms between bytes)
// into a buffer that grows with the bytes that came, never to the size announced; a reply
// that keeps leaving (write_timeout_ms); the next frame within idle_timeout_ms
// (rpc_client::heartbeat() keeps a quiet client alive); accept failures such as EMFILE back
// off; text from peers is escaped before it is logged, and a refused stranger is not told the
// cluster id. A client whose connection is closed before the handshake completes retries
// within connect_timeout_ms; a refusal with a reason fails at once. A client never allocates
// more for a reply than the caller's buffers (failure replies carry at most a small reason).
//
// Errors: every blocking call comes as a throwing form (dtf::error naming the peer) and a form
// taking std::error_code& (set to the dtf::errc of the same failure; the message is lost).
//
// Thread safety: an rpc_client serves one thread at a time (its I/O runs on the calling
// thread, io_context::run_for, which avoids a thread hand-off per message). rpc_server::stop()
// may be called from any thread; the handler is called from the server's I/O threads.
#pragma once

#include <dtf/detail/archive.hpp>
#include <dtf/detail/frame.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/error.hpp>
#include <dtf/transport/address.hpp>
#include <dtf/transport/cluster_hosts.hpp>
#include <dtf/transport/handshake.hpp>
#include <dtf/transport/impl/io.hpp>
#include <dtf/transport/impl/stream.hpp>
#include <dtf/transport/options.hpp>
#include <dtf/transport/tls.hpp>

#include <asio.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

namespace dtf {


/// A request payload produced in segments while it is written: a CUDA build's device memory
/// staged through pinned host memory (dtf/detail/staging_pipeline.hpp), where segment k+1 is
/// copied while segment k is on the wire. An interface, not a template parameter, because
/// rpc_client is not a template and the ps client's staging differs per build.
class payload_segments {
 public:
  /// The payload's size in bytes.
  virtual std::size_t total_bytes() const = 0;
  /// The number of segments.
  virtual std::size_t count() const = 0;
  /// Segment k's bytes, ready to write; called for k = 0, 1, … in order from the I/O of the
  /// calling thread. May block (for the copy of segment k) and throw dtf::error.
  virtual std::span<const std::byte> segment(std::size_t k) = 0;

 protected:
  ~payload_segments() = default;
};

/// A reply payload consumed in segments as it is read (the reverse of payload_segments).
class reply_segments {
 public:
  /// The payload's size in bytes.
  virtual std::size_t total_bytes() const = 0;
  /// The number of segments.
  virtual std::size_t count() const = 0;
  /// Where segment k is read (k = 0, 1, … in order).
  virtual std::span<std::byte> segment(std::size_t k) = 0;
  /// Segment k has been read (may start work on it without waiting; may throw dtf::error).
  virtual void received(std::size_t k) = 0;

 protected:
  ~reply_segments() = default;
};

/// One request to one peer inside rpc_client::call_all.
struct rpc_call {
  /// The peer's index (rpc_client::add_peer).
  std::size_t peer = 0;
  /// The request's message kind.
  detail::message_kind kind = detail::message_kind::reply;
  std::vector<std::byte> meta;                     ///< encoded control message
  std::vector<asio::const_buffer> payload;         ///< gathered from the caller's memory
  std::vector<asio::mutable_buffer> reply_payload;  ///< scattered into the caller's memory;
                                                    ///< the reply must fill it exactly
  std::vector<std::byte> reply_meta;               ///< out: the reply's control message
  /// Optional, instead of payload: the payload written segment by segment. The frame on the
  /// wire is the same (the peer cannot tell).
  payload_segments* payload_source = nullptr;
  /// Optional, instead of reply_payload: the reply payload read segment by segment; the reply
  /// must fill it exactly.
  reply_segments* reply_sink = nullptr;
};

/// The client side: connections to a set of named peers, requests in parallel.
class rpc_client {
 public:
  /// Errors: errc::invalid_config for options.tls without a secret.
  explicit rpc_client(transport_options options)
      : options_(std::move(options)),
        tls_context_(detail::make_tls_context(options_.tls, detail::tls_role::client,
                                              {options_.secret, options_.task_key}, options_.identity,
                                              options_.cluster_id)) {}
  rpc_client(const rpc_client&) = delete;
  rpc_client& operator=(const rpc_client&) = delete;

  /// Adds a peer ("ps.0" at "host:port"); returns its index.
  std::size_t add_peer(std::string name, std::string address);
  /// The number of peers.
  std::size_t num_peers() const noexcept { return peers_.size(); }
  /// Peer i's name.
  const std::string& peer_name(std::size_t i) const;

  /// Connects to every peer not yet connected and performs the handshake, retrying refused
  /// connections until connect_timeout_ms. Errors: errc::timeout naming the peer that never
  /// answered; errc::peer_failure when a peer refuses (wrong cluster, secret or version);
  /// errc::invalid_config for an address that does not parse or resolve.
  void connect_all();
  /// As connect_all(), reporting the error in `ec` instead of throwing.
  void connect_all(std::error_code& ec);

  /// Sends every call (at most one per peer), then waits for all replies. The first failure
  /// is reported after the others have finished or timed out; a peer whose exchange failed is
  /// disconnected (connect_all() reconnects it). Errors: errc::timeout, errc::peer_failure
  /// (connection lost, a malformed reply, a reply larger than expected), or the errc of a
  /// failure reply (the connection stays up), each naming the peer.
  void call_all(std::span<rpc_call> calls);
  /// As call_all(calls), reporting the error in `ec` instead of throwing.
  void call_all(std::span<rpc_call> calls, std::error_code& ec);

  /// One request to one peer.
  void call(rpc_call& c) { call_all(std::span<rpc_call>(&c, 1)); }
  /// As call(c), reporting the error in `ec` instead of throwing.
  void call(rpc_call& c, std::error_code& ec) { call_all(std::span<rpc_call>(&c, 1), ec); }

  /// Exchanges a heartbeat with every connected peer, so that a client with nothing to ask for
  /// longer than the servers' idle_timeout_ms keeps its connections. Errors: as call_all.
  void heartbeat();
  /// As heartbeat(), reporting the error in `ec` instead of throwing.
  void heartbeat(std::error_code& ec);

  /// The client's options.
  const transport_options& options() const noexcept { return options_; }

 private:
  struct peer;
  struct exchange;
  std::optional<error> try_connect_all();
  std::optional<error> try_call_all(std::span<rpc_call> calls);
  std::optional<error> try_heartbeat();
  void fail(exchange& x, errc code, const std::string& what);
  void start(exchange& x);
  void read_reply_header(exchange& x);
  void read_reply_payload(exchange& x);
  void write_segment(exchange& x, std::size_t k);
  void read_segment(exchange& x, std::size_t k);
  void discard_payload(exchange& x, std::uint64_t left, errc code, std::string reason);
  void connect(peer& p);
  bool handshake(peer& p, std::chrono::steady_clock::time_point deadline, std::string& closed);

  transport_options options_;
  detail::tls_context tls_context_;  // options_.tls
  asio::io_context io_;
  std::vector<std::unique_ptr<peer>> peers_;
  std::uint64_t request_id_ = 0;
};

/// What a server handler sends back.
struct rpc_reply {
  std::uint32_t status = 0;                  ///< 0, or an errc value (then meta is a refused_msg)
  /// The encoded control message.
  std::vector<std::byte> meta;
  std::vector<asio::const_buffer> payload;   ///< must stay valid until the reply is written
  std::vector<std::shared_ptr<const void>> holds;  ///< kept until the reply is written (e.g. leases of the payload)
  bool stop_server = false;                  ///< stop the server once the reply is written
  bool deferred = false;                     ///< the handler answers later through an rpc_responder

  /// A failure reply carrying `code` and `reason`.
  static rpc_reply failure(errc code, const std::string& reason) {
    rpc_reply r;
    r.status = std::uint32_t(code);
    r.meta = detail::encode_message(detail::refused_msg{reason});
    return r;
  }
};

/// A request's payload handed to the handler a piece at a time as its bytes arrive (see
/// rpc_server's payload_pieces). An empty `ends` means: not streamed, the usual single call.
struct rpc_pieces {
  /// Where each piece ends, in bytes from the payload's start: increasing, the last one the
  /// payload's size.
  std::vector<std::uint64_t> ends;
  /// Called on the connection's strand with piece i once all its bytes are in, in order, while
  /// the next piece's bytes arrive. A throw is the request's reply: later pieces are read and
  /// not handed over, and finish is not called.
  std::function<void(std::size_t i, std::span<std::byte> piece)> on_piece;
  /// Called after the last piece, instead of the handler, to build the reply (it may throw as
  /// the handler may).
  std::function<void(rpc_reply&)> finish;
};

/// Sends a deferred reply later, from any thread (the request's connection reads nothing
/// else until then). A reply to a peer that has gone is dropped.
class rpc_responder {
 public:
  rpc_responder() = default;
  /// A responder that sends through `send`.
  explicit rpc_responder(std::function<void(rpc_reply)> send) : send_(std::move(send)) {}
  /// Sends reply `r` (nothing when the responder is empty).
  void send(rpc_reply r) const {
    if (send_) send_(std::move(r));
  }

 private:
  std::function<void(rpc_reply)> send_;
};

/// Facts about a connected, authenticated peer, passed to the handler.
struct rpc_peer {
  std::string identity;  ///< as presented in the handshake ("worker.1"), escaped (safe to log)
  std::string remote;    ///< "127.0.0.1:51234"
  std::vector<std::byte>* scratch = nullptr;  ///< per-connection buffer a handler may fill for its payload
  /// For a handler that sets rpc_reply::deferred: the way to answer this request later.
  std::function<rpc_responder()> defer;
  /// The same with a deadline: the request is answered once, by the responder's send or, when
  /// `limit` passes first, by at_deadline()'s reply (built then, on the connection's strand).
  std::function<rpc_responder(std::chrono::milliseconds limit, std::function<rpc_reply()> at_deadline)> defer_until;
};

/// The server side. Handler: `void operator()(const rpc_peer&, const detail::frame_header&,
/// std::span<const std::byte> meta, std::span<std::byte> payload, rpc_reply&)`; it may throw
/// dtf::error, which becomes a failure reply with the message (the connection stays up).
/// Optionally `void disconnected(const rpc_peer&)`, called when an authenticated peer's
/// connection ends, and `std::uint64_t payload_limit(const rpc_peer&, const detail::frame_header&,
/// std::span<const std::byte> meta)`: before a request's payload needs a larger buffer than
/// its connection has, the server reads the meta and asks this for the most payload bytes that
/// request may carry; a larger announcement (or a throw) is answered at once with a failure
/// naming both sizes (or the reason thrown), and the payload's bytes are read and dropped
/// without allocating for them; the connection goes on. Without it, payloads are bounded
/// by transport_options::limits only. Optionally `rpc_pieces payload_pieces(const rpc_peer&,
/// const detail::frame_header&, std::span<const std::byte> meta)`: for a payload of at least
/// transport_options::pieces_min_bytes the meta is read first and this may return pieces to
/// take the payload in as it arrives (a throw or empty ends: not streamed). Heartbeats are
/// answered by the server itself.
template <class Handler>
class rpc_server {
 public:
  /// Binds to `bind_address` ("host:port"; port 0 picks a free one). Errors: errc::io_error
  /// when the port is taken, errc::invalid_config for an address that does not parse or for
  /// options.tls without a secret.
  rpc_server(Handler& handler, transport_options options, const std::string& bind_address, int threads = 1);

  /// The port it listens on (the one picked for port 0).
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

  /// Serves on `threads` threads (this one included) until stop().
  void run();

  /// Stops accepting and closes every connection; run() returns. Thread-safe.
  void stop();

  /// Number of connections that failed the handshake, sent a malformed frame, went idle or
  /// were refused at the connection cap.
  std::size_t rejected() const noexcept { return rejected_.load(); }
  /// Connections open now (handshaking or authenticated).
  std::size_t connections() const noexcept { return open_.load(); }
  /// Connections in the handshake now.
  std::size_t handshaking() const noexcept { return handshaking_.load(); }

 private:
  class session;
  void accept();
  // The handshake budgets: whether a connection from `source` may start its handshake (it is
  // then counted until end_handshake), and the reason when not.
  std::string admit_handshake(const std::string& source);
  void end_handshake(const std::string& source);

  Handler& handler_;
  transport_options options_;
  detail::tls_context tls_context_;  // options_.tls
  // Before io_: sessions still queued in io_ decrement open_ when io_ destroys them.
  std::atomic<std::size_t> rejected_{0}, open_{0}, handshaking_{0}, authenticated_{0};
  std::mutex sources_mu_;
  std::unordered_map<std::string, std::size_t> handshaking_from_;  // by source address
  // The cluster's hosts (options_.cluster_hosts resolved) and the handshakes in progress from
  // them and from everyone else: two budgets of max_handshakes (under sources_mu_).
  std::set<std::string> cluster_sources_;
  std::size_t handshaking_own_ = 0, handshaking_strangers_ = 0;
  // Dropped before authenticating, dropped after it (without a secret anyone authenticates),
  // requests refused unread: a line a second each, with a count (refusal_log_interval_ms).
  detail::log_limiter stranger_log_, peer_log_, refusal_log_;
  asio::io_context io_;
  detail::tcp_acceptor acceptor_;
  detail::steady_timer_on<detail::io_executor> accept_backoff_;
  std::chrono::milliseconds accept_pause_{0};
  detail::log_limiter accept_log_, cap_log_;  // accept failures; refusals at accept
  int threads_;
};

}  // namespace dtf

#include <dtf/transport/impl/rpc_client.hpp>
#include <dtf/transport/impl/rpc_listener.hpp>
#include <dtf/transport/impl/rpc_server.hpp>
