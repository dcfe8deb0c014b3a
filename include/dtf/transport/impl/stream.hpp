// dtf/transport/impl/stream.hpp — the byte stream of a request/reply connection: a TCP socket,
// plain or under TLS 1.3 (dtf/transport/tls.hpp), behind one type whose async_read_some and
// async_write_some forward to whichever it is, so that the frame code (asio::async_read and
// asio::async_write over it) is the same in both modes.
//
// Why a runtime choice and not a template parameter: the mode is a run-time option of one
// binary (--tls), and a plain connection then pays one predictable branch per system call, not
// a second instantiation of every state machine of the client and the server.
//
// Why not asio::ssl::stream: its timers use any_io_executor, whose property machinery nvcc's
// front end cannot compile (see dtf/transport/impl/io.hpp), and every header must compile in
// a CUDA build. The TLS machine (detail::tls_channel, memory BIOs) is driven here instead, which
// also lets a write encrypt up to tls_write_chunk bytes and send them in one system call rather
// than one per 16 KiB record.
#pragma once

#include <dtf/error.hpp>
#include <dtf/transport/handshake.hpp>
#include <dtf/transport/impl/io.hpp>
#include <dtf/transport/tls.hpp>

#include <asio.hpp>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace dtf::detail {

/// Plaintext bytes one TLS write encrypts before it sends them (in one system call).
inline constexpr std::size_t tls_write_chunk = std::size_t(256) << 10;
/// Ciphertext bytes one TLS read takes from the socket at most.
inline constexpr std::size_t tls_read_chunk = std::size_t(64) << 10;

/// A connection's stream: the TCP socket, with a TLS layer over it once start_tls() was called
/// (reset_tls() before the socket carries a new connection). Thread safety: one operation at a
/// time (dtf's client and server never read and write one connection at once); completions
/// run on the handler's associated executor (a session's strand).
class rpc_stream {
 public:
  using executor_type = io_executor;
  using lowest_layer_type = tcp_socket;

  explicit rpc_stream(asio::io_context& io) : socket_(io) {}
  explicit rpc_stream(tcp_socket socket) : socket_(std::move(socket)) {}
  rpc_stream(const rpc_stream&) = delete;
  rpc_stream& operator=(const rpc_stream&) = delete;

  executor_type get_executor() noexcept { return socket_.get_executor(); }
  tcp_socket& lowest_layer() noexcept { return socket_; }
  bool is_open() const { return socket_.is_open(); }
  void close() { socket_.close(); }
  void close(std::error_code& ec) { socket_.close(ec); }
  template <class Option>
  void set_option(const Option& o) { socket_.set_option(o); }
  template <class Option>
  void set_option(const Option& o, std::error_code& ec) { socket_.set_option(o, ec); }
  asio::ip::tcp::endpoint remote_endpoint(std::error_code& ec) const { return socket_.remote_endpoint(ec); }
  template <class Handler>
  void async_connect(const asio::ip::tcp::endpoint& e, Handler&& h) { socket_.async_connect(e, std::forward<Handler>(h)); }

  bool encrypted() const noexcept { return tls_ != nullptr; }
  /// A fresh TLS layer over the connected socket, before any byte of the connection.
  void start_tls(SSL_CTX* ctx, tls_role role) {
    tls_ = std::make_unique<tls_channel>(ctx, role);
    cipher_in_.resize(tls_read_chunk);
  }
  void reset_tls() noexcept {
    tls_.reset();
    handshake_bytes_in_ = 0;
  }
  /// Bytes the peer sent during the TLS handshake (0: it closed or reset the connection
  /// without answering, as a server over its handshake budget does).
  std::size_t handshake_bytes_in() const noexcept { return handshake_bytes_in_; }

  /// The TLS handshake; `handler(std::error_code)` (tls_error_text names the cause).
  template <class Handler>
  void async_tls_handshake(Handler handler) {
    handshake_step(std::move(handler), false);
  }

  template <class Buffers, class Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (!tls_) return socket_.async_read_some(buffers, std::forward<Handler>(handler));
    tls_read(buffers, std::move(handler), false);
  }

  template <class Buffers, class Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (!tls_) return socket_.async_write_some(buffers, std::forward<Handler>(handler));
    tls_write(buffers, std::move(handler));
  }

 private:
  // Where `h` runs (its strand): inner operations complete there too.
  template <class Handler>
  auto executor_of(const Handler& h) {
    return asio::get_associated_executor(h, socket_.get_executor());
  }
  // Completes `h` later (never inside the call that started the operation).
  template <class Handler, class... Args>
  void post(Handler h, Args... args) {
    const auto ex = executor_of(h);
    asio::post(ex, [h = std::move(h), args...]() mutable { h(args...); });
  }

  template <class Handler>
  void handshake_step(Handler h, bool in_completion) {
    const auto st = tls_->handshake();
    const auto out = tls_->output();
    if (out.empty()) return after_handshake_output(st, std::move(h), in_completion);
    const auto ex = executor_of(h);
    asio::async_write(socket_, asio::buffer(out.data(), out.size()), transfer_all_large{},
                      asio::bind_executor(ex, [this, st, h = std::move(h)](std::error_code ec, std::size_t) mutable {
                        if (tls_) tls_->consume_output();  // (null: reset after a close aborted this write)
                        if (ec && st != tls_channel::status::failed) return h(ec);
                        after_handshake_output(st, std::move(h), true);
                      }));
  }

  template <class Handler>
  void after_handshake_output(tls_channel::status st, Handler h, bool in_completion) {
    std::error_code result;
    if (st == tls_channel::status::failed) result = tls_->failure_code();
    if (st == tls_channel::status::closed) result = asio::error::eof;
    if (st != tls_channel::status::want_read) return in_completion ? h(result) : post(std::move(h), result);
    const auto ex = executor_of(h);
    socket_.async_read_some(asio::buffer(cipher_in_), asio::bind_executor(ex, [this, h = std::move(h)](
                                                                             std::error_code ec, std::size_t n) mutable {
                              if (ec) return h(ec);
                              handshake_bytes_in_ += n;
                              tls_->feed(cipher_in_.data(), n);
                              handshake_step(std::move(h), true);
                            }));
  }

  // Decrypts what the TLS layer holds into `buffers`; reads more ciphertext when it holds none.
  template <class Buffers, class Handler>
  void tls_read(const Buffers& buffers, Handler h, bool in_completion) {
    std::size_t got = 0;
    auto st = tls_channel::status::want_read;
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
      asio::mutable_buffer b(*it);
      while (b.size() > 0) {
        const std::size_t n = tls_->read(b.data(), b.size(), st);
        if (n == 0) break;
        got += n;
        b += n;
      }
      if (b.size() > 0) break;
    }
    std::error_code ec;
    if (got == 0 && st == tls_channel::status::closed) ec = asio::error::eof;
    if (got == 0 && st == tls_channel::status::failed) ec = tls_->failure_code();
    if (got > 0 || ec || asio::buffer_size(buffers) == 0)
      return in_completion ? h(ec, got) : post(std::move(h), ec, got);
    const auto ex = executor_of(h);
    socket_.async_read_some(asio::buffer(cipher_in_),
                            asio::bind_executor(ex, [this, buffers, h = std::move(h)](std::error_code e2,
                                                                                      std::size_t n) mutable {
                              if (e2) return h(e2, std::size_t(0));
                              tls_->feed(cipher_in_.data(), n);
                              tls_read(buffers, std::move(h), true);
                            }));
  }

  // Encrypts up to tls_write_chunk bytes of `buffers` and sends their records in one write.
  template <class Buffers, class Handler>
  void tls_write(const Buffers& buffers, Handler h) {
    std::size_t taken = 0;
    for (auto it = asio::buffer_sequence_begin(buffers); it != asio::buffer_sequence_end(buffers); ++it) {
      asio::const_buffer b(*it);
      const std::size_t n = std::min(b.size(), tls_write_chunk - taken);
      if (!tls_->write(b.data(), n)) return post(std::move(h), tls_->failure_code(), std::size_t(0));
      taken += n;
      if (taken == tls_write_chunk) break;
    }
    const auto out = tls_->output();
    const auto ex = executor_of(h);
    asio::async_write(socket_, asio::buffer(out.data(), out.size()), transfer_all_large{},
                      asio::bind_executor(ex, [this, taken, h = std::move(h)](std::error_code ec, std::size_t) mutable {
                        if (tls_) tls_->consume_output();  // (null: reset after a close aborted this write)
                        h(ec, ec ? std::size_t(0) : taken);
                      }));
  }

  tcp_socket socket_;
  std::unique_ptr<tls_channel> tls_;
  std::vector<std::byte> cipher_in_;
  std::size_t handshake_bytes_in_ = 0;
};

/// The reason of a failed TLS handshake (tls_failure_reason) from its error.
inline std::string tls_error_text(const std::error_code& ec) {
  if (ec == asio::error::eof || ec == asio::error::connection_reset) return tls_failure_reason(0, "");
  if (ec.category() == tls_category()) return tls_channel_failure_text(ec);
  return "TLS handshake failed: " + ec.message();
}

/// Server side of a new connection with TLS on: looks at its first byte (without consuming it);
/// a peer that did not start with a TLS handshake record gets tls_required_refusal in a plain
/// dtf frame; otherwise the TLS handshake runs. Then `done(std::string failure)` runs on
/// `executor` (failure empty: the TLS layer is up and the dtf handshake may start over it).
template <class Executor, class Done>
void async_accept_tls(rpc_stream& s, SSL_CTX* ctx, const Executor& executor, Done done) {
  struct state {
    std::array<unsigned char, 1> first{};
    std::vector<std::byte> refusal;
  };
  auto st = std::make_shared<state>();
  s.lowest_layer().async_receive(
      asio::buffer(st->first), asio::socket_base::message_peek,
      asio::bind_executor(executor, [&s, ctx, executor, st, done = std::move(done)](std::error_code ec,
                                                                                    std::size_t) mutable {
        if (ec) return done(ec == asio::error::eof ? "connection closed before the handshake" : ec.message());
        if (st->first[0] != tls_handshake_record) {
          st->refusal = refusal_frame(tls_required_refusal);
          return asio::async_write(s, asio::buffer(st->refusal),
                                   asio::bind_executor(executor, [st, done = std::move(done)](std::error_code,
                                                                                              std::size_t) mutable {
                                     done("refused: a peer without TLS (this task requires TLS: turn it on for "
                                          "every task or none)");
                                   }));
        }
        s.start_tls(ctx, tls_role::server);
        s.async_tls_handshake(asio::bind_executor(executor, [done = std::move(done)](std::error_code e2) mutable {
          done(e2 ? tls_error_text(e2) : std::string());
        }));
      }));
}

}  // namespace dtf::detail
