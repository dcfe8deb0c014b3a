// dtf/transport/impl/rpc_server.hpp — rpc_server's session (dtf/transport.hpp): one per
// connection, the handshake, then frames (a large payload optionally taken in pieces as it
// arrives). The listener's bodies are in dtf/transport/impl/rpc_listener.hpp, the reading of
// a request's payload in dtf/transport/impl/rpc_payload.hpp.
#pragma once

#include <dtf/transport.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <new>
#include <span>

namespace dtf {

// One connection: the handshake (shared machine), then frames until the peer leaves, a
// deadline passes or the server stops. Every completion runs on the session's strand.
template <class Handler>
class rpc_server<Handler>::session : public std::enable_shared_from_this<session> {
 public:
  session(rpc_server& s, detail::tcp_socket sock, std::string source)
      : server_(s),
        socket_(std::move(sock)),
        source_(std::move(source)),
        strand_(socket_.get_executor()),
        timer_(strand_),
        handshake_(detail::handshake::role::server,
                   {s.options_.cluster_id, s.options_.identity, s.options_.secret, s.options_.task_key}) {
    std::error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    remote_ = ec ? "unknown" : transport::format_address(ep.address().to_string(), ep.port());
    peer_.remote = remote_;
    peer_.scratch = &scratch_;
    peer_.defer = [this] {
      return rpc_responder([self = this->shared_from_this()](rpc_reply r) {
        asio::post(self->strand_, [self, r = std::move(r)]() mutable {
          if (!self->closed_) self->send_reply(std::move(r));
        });
      });
    };
    peer_.defer_until = [this](std::chrono::milliseconds limit, std::function<rpc_reply()> at_deadline) {
      // One answer: whichever of send() and the deadline reaches the strand first.
      struct pending {
        explicit pending(detail::io_strand& strand) : timer(strand) {}
        detail::steady_timer_on<detail::io_strand> timer;
        bool answered = false;
      };
      auto p = std::make_shared<pending>(strand_);
      auto answer = [self = this->shared_from_this(), p](rpc_reply r) {
        if (p->answered) return;
        p->answered = true;
        p->timer.cancel();
        if (!self->closed_) self->send_reply(std::move(r));
      };
      p->timer.expires_after(limit);
      p->timer.async_wait([p, answer, at_deadline = std::move(at_deadline)](std::error_code ec) {
        if (!ec && !p->answered) answer(at_deadline());
      });
      return rpc_responder([self = this->shared_from_this(), answer](rpc_reply r) {
        asio::post(self->strand_, [answer, r = std::move(r)]() mutable { answer(std::move(r)); });
      });
    };
    ++server_.open_;
  }
  ~session() {
    if (in_handshake_) server_.end_handshake(source_);
    if (authenticated_) --server_.authenticated_;
    --server_.open_;
  }

  void start() {
    std::error_code ec;
    socket_.set_option(asio::ip::tcp::no_delay(true), ec);
    arm(server_.options_.handshake_timeout_ms, "did not complete the handshake");
    if (!server_.tls_context_) return handshake_step();
    // TLS first (or a plain peer refused), then the dtf handshake inside it.
    detail::async_accept_tls(socket_, server_.tls_context_.get(), strand_,
                             [self = this->shared_from_this()](std::string failure) {
                               if (self->closed_) return;
                               if (!failure.empty()) return self->drop(failure);
                               self->handshake_step();
                             });
  }

 private:
  // One deadline at a time (handshake, idle between frames, or the rest of a frame), kept in
  // fields; the Asio timer is re-armed only when a deadline is earlier than its expiry. Setting
  // a deadline per frame is then two stores, not a cancel and a new wait per frame (which cost
  // ~5% of a 4 KiB request's latency).
  void arm(std::uint32_t ms, const char* what) {
    if (ms == 0) return disarm();
    deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    deadline_what_ = what;
    deadline_ms_ = ms;
    if (!timer_waiting_ || timer_.expiry() > deadline_) wait_for_deadline();
  }
  void disarm() { deadline_ = std::chrono::steady_clock::time_point::max(); }
  // Bytes moved: the deadline armed last starts again (deadlines follow progress).
  void touch() {
    if (deadline_ != std::chrono::steady_clock::time_point::max())
      deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms_);
  }
  // A completion condition for large reads and writes that calls touch() each time bytes
  // moved; it runs on the strand (Asio calls it from the operation's intermediate handlers).
  struct progress {
    session* s;
    std::size_t operator()(const std::error_code& ec, std::size_t) const {
      if (ec) return 0;
      s->touch();
      return std::size_t(1) << 30;
    }
  };

  void wait_for_deadline() {
    const std::uint64_t generation = ++timer_generation_;
    timer_waiting_ = true;
    timer_.expires_at(deadline_);
    timer_.async_wait(asio::bind_executor(strand_, [self = this->shared_from_this(), generation](std::error_code ec) {
      // Superseded by an earlier deadline (its own wait is pending), or the session closed.
      if (generation != self->timer_generation_) return;
      self->timer_waiting_ = false;
      if (ec || self->closed_ || self->deadline_ == std::chrono::steady_clock::time_point::max()) return;
      if (std::chrono::steady_clock::now() < self->deadline_) return self->wait_for_deadline();  // moved later
      self->drop(std::string(self->deadline_what_) + " within " + std::to_string(self->deadline_ms_) + " ms");
    }));
  }

  void notify_disconnected() {
    if constexpr (requires { server_.handler_.disconnected(peer_); })
      if (authenticated_) server_.handler_.disconnected(peer_);
  }

  void drop(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    notify_disconnected();
    if (!authenticated_ || reason.find("closed") == std::string::npos) ++server_.rejected_;
    const auto line = "dtf " + server_.options_.identity + ": disconnected " +
                      (peer_.identity.empty() ? "" : "'" + peer_.identity + "' ") + "from " + remote_ + ": " + reason;
    // Anyone may cause this line before authentication, and after it too without a secret (or
    // an insider with a task's key): at most one a second each, with a count.
    (authenticated_ ? server_.peer_log_ : server_.stranger_log_)(
        [&](const std::string& suppressed) { detail::log_line(server_.options_, line + suppressed); });
    std::error_code ec;
    timer_.cancel();
    socket_.close(ec);
  }

  // ---- handshake: the shared machine, fed exactly the bytes it asks for ----------------------
  void handshake_step() {
    if (closed_) return;
    out_ = handshake_.take_output();
    if (!out_.empty()) {
      asio::async_write(socket_, asio::buffer(out_),
                        asio::bind_executor(strand_, [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                          if (self->closed_) return;
                          if (ec && self->handshake_.status() != detail::handshake::state::failed)
                            return self->drop("handshake reply not delivered: " + ec.message());
                          self->after_handshake_output();
                        }));
      return;
    }
    after_handshake_output();
  }

  void after_handshake_output() {
    using state = detail::handshake::state;
    if (handshake_.status() == state::failed) {
      peer_.identity = handshake_.peer_identity();
      return drop(handshake_.failure());
    }
    if (handshake_.status() == state::done) {
      peer_.identity = handshake_.peer_identity();
      in_handshake_ = false;
      server_.end_handshake(source_);
      if (server_.authenticated_.fetch_add(1) >= server_.options_.max_connections) {
        --server_.authenticated_;
        return drop(std::to_string(server_.options_.max_connections) +
                    " authenticated connections open (max_connections)");
      }
      authenticated_ = true;
      disarm();
      return read_header();
    }
    in_.resize(handshake_.bytes_wanted());
    asio::async_read(socket_, asio::buffer(in_),
                     asio::bind_executor(strand_, [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                       if (self->closed_) return;
                       if (ec)
                         return self->drop(ec == asio::error::eof ? "connection closed before the handshake"
                                                                  : ec.message());
                       self->handshake_.receive(self->in_);
                       self->handshake_step();
                     }));
  }

  // ---- frames after the handshake -------------------------------------------------------------
  void read_header() {
    // Between frames: the next one must start within idle_timeout_ms.
    arm(server_.options_.idle_timeout_ms, "sent nothing (idle)");
    asio::async_read(socket_, asio::buffer(in_header_),
                     asio::bind_executor(strand_, [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                       self->on_header(ec);
                     }));
  }

  void on_header(std::error_code ec) {
    if (closed_) return;
    if (ec) {
      // A peer that closes between frames is ordinary (a worker ending).
      if (ec == asio::error::eof) {
        closed_ = true;
        timer_.cancel();
        notify_disconnected();
        return;
      }
      return drop(ec.message());
    }
    try {
      header_ = detail::decode_header(in_header_, server_.options_.limits);
    } catch (const error& e) {
      return drop(e.message());
    }
    // Bytes of a frame are arriving: they must keep arriving (frame_timeout_ms between them).
    arm(server_.options_.frame_timeout_ms, "sent an incomplete frame");
    meta_.resize(header_.meta_size);
    // The meta first for a payload that needs a larger buffer than this connection has (the
    // buffer then grows with the bytes that arrive; with a handler that bounds payloads, it
    // says first what this request may carry), and for a large payload a handler may take in
    // pieces.
    if (header_.payload_size > payload_.size() || pieceable()) {
      asio::async_read(socket_, asio::buffer(meta_),
                       asio::bind_executor(strand_, [self = this->shared_from_this()](std::error_code e2, std::size_t) {
                         self->on_meta(e2);
                       }));
      return;
    }
    read_body(true);
  }

  bool bounded() const {
    if constexpr (requires(std::span<const std::byte> m) { server_.handler_.payload_limit(peer_, header_, m); })
      return header_.payload_size > payload_.size();
    return false;
  }
  bool pieceable() const {
    if constexpr (requires(std::span<const std::byte> m) { server_.handler_.payload_pieces(peer_, header_, m); })
      return header_.payload_size >= server_.options_.pieces_min_bytes;
    return false;
  }

  void on_meta(std::error_code ec) {
    if (closed_) return;
    if (ec) return drop("truncated frame: " + ec.message());
    const std::span<const std::byte> meta(meta_);
    if constexpr (requires { server_.handler_.payload_limit(peer_, header_, meta); }) {
      if (bounded()) {
        std::uint64_t limit = 0;
        try {
          limit = server_.handler_.payload_limit(peer_, header_, meta);
        } catch (const std::exception& e) {
          return refuse_payload(e.what(), header_.payload_size);
        }
        if (header_.payload_size > limit)
          return refuse_payload("a request of kind " + std::to_string(int(header_.kind)) + " announcing " +
                                    std::to_string(header_.payload_size) + " payload bytes, where at most " +
                                    std::to_string(limit) + " are expected",
                                header_.payload_size);
      }
    }
    if constexpr (requires { server_.handler_.payload_pieces(peer_, header_, meta); }) {
      if (pieceable()) {
        try {
          pieces_ = server_.handler_.payload_pieces(peer_, header_, meta);
        } catch (const std::exception&) {
          pieces_ = {};  // not in pieces: the handler's single call answers the request
        }
        const auto& e = pieces_.ends;
        if (e.empty() || e.back() != header_.payload_size || !std::is_sorted(e.begin(), e.end()) ||
            std::adjacent_find(e.begin(), e.end()) != e.end() || e.front() == 0)
          pieces_ = {};
      }
    }
    read_body(false);
  }

  // The payload: bodies in dtf/transport/impl/rpc_payload.hpp.
  void read_body(bool with_meta);
  void read_growing(std::uint64_t have);
  void read_piece();
  void on_piece(std::error_code ec);
  void refuse_payload(std::string why, std::uint64_t unread);
  void discard_payload();

  // Runs f(reply); an exception becomes a failure reply. False when f threw.
  template <class F>
  bool handle(F f, rpc_reply& reply) {
    try {
      f(reply);
      return true;
    } catch (const error& e) {
      reply = rpc_reply::failure(static_cast<errc>(e.code().value()), e.message());
    } catch (const std::bad_alloc&) {
      reply = rpc_reply::failure(errc::invalid_argument, "out of memory while handling a request of kind " +
                                                             std::to_string(int(header_.kind)));
    } catch (const std::exception& e) {
      reply = rpc_reply::failure(errc::internal, e.what());
    }
    return false;
  }

  void on_frame(std::error_code ec) {
    if (closed_) return;
    if (ec) return drop("truncated frame: " + ec.message());
    disarm();
    rpc_reply reply;
    if (header_.kind == detail::message_kind::heartbeat) return send_reply(std::move(reply));
    handle([&](rpc_reply& r) {
      server_.handler_(peer_, header_, meta_, std::span<std::byte>(payload_.data(), header_.payload_size), r);
    }, reply);
    if (reply.deferred) return;  // answered later through peer_.defer(); read nothing until then
    send_reply(std::move(reply));
  }

  void send_reply(rpc_reply reply) {
    reply_ = std::move(reply);
    detail::frame_header h;
    h.kind = detail::message_kind::reply;
    h.status = reply_.status;
    h.request_id = header_.request_id;
    h.meta_size = std::uint32_t(reply_.meta.size());
    for (const auto& b : reply_.payload) h.payload_size += b.size();
    out_header_ = detail::encode_header(h);
    out_bufs_.clear();
    out_bufs_.push_back(asio::buffer(out_header_));
    out_bufs_.push_back(asio::buffer(reply_.meta));
    out_bufs_.insert(out_bufs_.end(), reply_.payload.begin(), reply_.payload.end());
    // The reply must keep leaving: a peer that stops reading is dropped after write_timeout_ms,
    // and the buffers the reply pins (shard leases) are released.
    arm(server_.options_.write_timeout_ms, "did not read its reply");
    asio::async_write(socket_, out_bufs_, progress{this},
                      asio::bind_executor(strand_, [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                        self->reply_.holds.clear();  // the payload's buffers are written (or never will be)
                        if (ec) return self->drop("reply not delivered: " + ec.message());
                        if (self->reply_.stop_server) {
                          self->closed_ = true;
                          self->server_.stop();
                          return;
                        }
                        if (self->discard_ > 0) {
                          self->arm(self->server_.options_.frame_timeout_ms, "sent an incomplete frame");
                          return self->discard_payload();
                        }
                        self->read_header();
                      }));
  }

  rpc_server& server_;
  detail::rpc_stream socket_;
  std::string source_;  // the peer's address, counted in the server's handshake budgets
  bool in_handshake_ = true;
  detail::io_strand strand_;
  detail::steady_timer_on<detail::io_strand> timer_;
  detail::handshake handshake_;
  std::string remote_;
  rpc_peer peer_;
  bool authenticated_ = false, closed_ = false;
  std::uint64_t timer_generation_ = 0;
  bool timer_waiting_ = false;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  const char* deadline_what_ = "";
  std::uint32_t deadline_ms_ = 0;
  std::array<std::byte, detail::frame_header_size> in_header_{}, out_header_{};
  detail::frame_header header_{};
  std::vector<std::byte> in_, out_, meta_, payload_, scratch_;
  rpc_reply reply_;
  std::uint64_t discard_ = 0;   // bytes of a refused payload still to read and drop
  std::vector<std::byte> sink_;  // where they go
  std::vector<asio::const_buffer> out_bufs_;
  rpc_pieces pieces_;           // the request being taken in pieces (empty ends: none)
  std::size_t piece_ = 0;       // the next piece to read
  bool pieces_failed_ = false;  // a piece's handling threw: pieces_reply_ holds the failure
  rpc_reply pieces_reply_;
};

}  // namespace dtf

#include <dtf/transport/impl/rpc_payload.hpp>
