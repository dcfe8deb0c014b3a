// dtf/transport/impl/rpc_client.hpp — the bodies of rpc_client (dtf/transport.hpp).
#pragma once

#include <dtf/transport.hpp>

#include <algorithm>
#include <array>

namespace dtf {

struct rpc_client::peer {
  peer(asio::io_context& io, std::string n, std::string a) : socket(io), name(std::move(n)), address(std::move(a)) {}
  detail::rpc_stream socket;
  std::string name, address;
  bool connected = false;
  std::string describe() const { return name + " (" + address + ")"; }
};

struct rpc_client::exchange {
  exchange(peer& pp, rpc_call& cc, std::uint64_t id) : p(pp), c(cc), request_id(id) {}
  peer& p;
  rpc_call& c;
  std::uint64_t request_id;
  std::array<std::byte, detail::frame_header_size> out_header{}, in_header{};
  detail::frame_header reply{};
  bool done = false;
  bool fatal = true;  // a failure reply (status != 0) leaves the connection usable
  std::optional<error> failure;
};

inline std::size_t rpc_client::add_peer(std::string name, std::string address) {
  peers_.push_back(std::make_unique<peer>(io_, std::move(name), std::move(address)));
  return peers_.size() - 1;
}

inline const std::string& rpc_client::peer_name(std::size_t i) const { return peers_.at(i)->name; }

namespace detail {
inline void throw_if(std::optional<error>& e) {
  if (e) throw std::move(*e);
}
inline void set_code(const std::optional<error>& e, std::error_code& ec) { ec = e ? e->code() : std::error_code(); }
}  // namespace detail

inline void rpc_client::connect_all() {
  auto e = try_connect_all();
  detail::throw_if(e);
}
inline void rpc_client::connect_all(std::error_code& ec) { detail::set_code(try_connect_all(), ec); }
inline void rpc_client::call_all(std::span<rpc_call> calls) {
  auto e = try_call_all(calls);
  detail::throw_if(e);
}
inline void rpc_client::call_all(std::span<rpc_call> calls, std::error_code& ec) {
  detail::set_code(try_call_all(calls), ec);
}
inline void rpc_client::heartbeat() {
  auto e = try_heartbeat();
  detail::throw_if(e);
}
inline void rpc_client::heartbeat(std::error_code& ec) { detail::set_code(try_heartbeat(), ec); }

inline std::optional<error> rpc_client::try_connect_all() {
  try {
    for (auto& p : peers_)
      if (!p->connected) connect(*p);
  } catch (const error& e) {
    return e;
  }
  return std::nullopt;
}

inline std::optional<error> rpc_client::try_heartbeat() {
  std::vector<rpc_call> calls;
  for (std::size_t i = 0; i < peers_.size(); ++i)
    if (peers_[i]->connected) calls.push_back(rpc_call{.peer = i, .kind = detail::message_kind::heartbeat});
  return try_call_all(calls);
}

inline std::optional<error> rpc_client::try_call_all(std::span<rpc_call> calls) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  std::vector<std::unique_ptr<exchange>> xs;
  std::vector<bool> used(peers_.size(), false);
  for (auto& c : calls) {
    if (c.peer >= peers_.size())
      return error(errc::invalid_argument, "rpc_client::call_all: no peer " + std::to_string(c.peer));
    peer& p = *peers_[c.peer];
    if (used[c.peer]) return error(errc::invalid_argument, "rpc_client::call_all: two calls to " + p.describe());
    used[c.peer] = true;
    if (!p.connected)
      return error(errc::peer_failure, "no connection to " + p.describe() + " (it failed earlier or was never connected)");
    xs.push_back(std::make_unique<exchange>(p, c, ++request_id_));
  }
  for (auto& x : xs) start(*x);
  const auto all_done = [&] {
    for (auto& x : xs)
      if (!x->done) return false;
    return true;
  };
  if (!detail::run_until(io_, deadline, all_done)) {
    for (auto& x : xs)
      if (!x->done) {
        x->failure = error(errc::timeout, "no reply from " + x->p.describe() + " within " +
                                              std::to_string(options_.timeout_ms) + " ms");
        x->p.socket.close();
      }
    // Let the aborted handlers run (they only mark completion).
    detail::run_until(io_, std::chrono::steady_clock::now() + std::chrono::seconds(5), all_done);
  }
  for (auto& x : xs)
    if (x->failure && x->fatal) {
      x->p.connected = false;
      x->p.socket.close();
    }
  for (auto& x : xs)
    if (x->failure) return std::move(*x->failure);
  return std::nullopt;
}

inline void rpc_client::fail(exchange& x, errc code, const std::string& what) {
  if (!x.failure) x.failure = error(code, x.p.describe() + ": " + what);
  x.done = true;
}

inline void rpc_client::start(exchange& x) {
  detail::frame_header h;
  h.kind = x.c.kind;
  h.meta_size = std::uint32_t(x.c.meta.size());
  h.request_id = x.request_id;
  for (const auto& b : x.c.payload) h.payload_size += b.size();
  if (x.c.payload_source) h.payload_size += x.c.payload_source->total_bytes();
  x.out_header = detail::encode_header(h);
  std::vector<asio::const_buffer> bufs{asio::buffer(x.out_header), asio::buffer(x.c.meta)};
  bufs.insert(bufs.end(), x.c.payload.begin(), x.c.payload.end());
  asio::async_write(x.p.socket, bufs, detail::transfer_all_large{}, [this, &x](std::error_code ec, std::size_t) {
    if (ec) return fail(x, errc::peer_failure, "send failed: " + ec.message());
    if (x.c.payload_source) return write_segment(x, 0);
    read_reply_header(x);
  });
}

// A segmented payload: segment k is written once the source has it ready; the source prepares
// segment k+1 (a copy from device memory) while this write is on the wire.
inline void rpc_client::write_segment(exchange& x, std::size_t k) {
  if (k == x.c.payload_source->count()) return read_reply_header(x);
  std::span<const std::byte> seg;
  try {
    seg = x.c.payload_source->segment(k);
  } catch (const error& e) {
    // Part of the frame is on the wire: the connection is dropped (fatal) after this call.
    if (!x.failure) x.failure = error(e.code(), x.p.describe() + ": " + e.message());
    x.done = true;
    return;
  }
  asio::async_write(x.p.socket, asio::buffer(seg.data(), seg.size()), detail::transfer_all_large{},
                    [this, &x, k](std::error_code ec, std::size_t) {
    if (ec) return fail(x, errc::peer_failure, "send failed: " + ec.message());
    write_segment(x, k + 1);
  });
}

inline void rpc_client::read_segment(exchange& x, std::size_t k) {
  if (k == x.c.reply_sink->count()) {
    x.done = true;
    return;
  }
  const auto seg = x.c.reply_sink->segment(k);
  asio::async_read(x.p.socket, asio::buffer(seg.data(), seg.size()), detail::transfer_all_large{},
                   [this, &x, k](std::error_code ec, std::size_t) {
    if (ec) return fail(x, errc::peer_failure, "connection lost while reading a reply payload: " + ec.message());
    try {
      x.c.reply_sink->received(k);
    } catch (const error& e) {
      if (!x.failure) x.failure = error(e.code(), x.p.describe() + ": " + e.message());
      x.done = true;
      return;
    }
    read_segment(x, k + 1);
  });
}

inline void rpc_client::read_reply_header(exchange& x) {
  asio::async_read(x.p.socket, asio::buffer(x.in_header), [this, &x](std::error_code ec, std::size_t) {
    if (ec) return fail(x, errc::peer_failure, "connection lost while waiting for a reply: " + ec.message());
    try {
      x.reply = detail::decode_header(x.in_header, options_.limits);
    } catch (const error& e) {
      return fail(x, errc::peer_failure, "malformed reply: " + e.message());
    }
    if (x.reply.kind != detail::message_kind::reply)
      return fail(x, errc::peer_failure, "answered with a frame that is not a reply");
    if (x.reply.request_id != x.request_id)
      return fail(x, errc::peer_failure, "reply to request " + std::to_string(x.reply.request_id) + ", expected " +
                                             std::to_string(x.request_id));
    // Nothing is allocated for a reply beyond what the caller expects: the payload must match
    // the caller's buffers exactly, and a failure reply carries none.
    std::size_t expected = 0;
    for (const auto& b : x.c.reply_payload) expected += b.size();
    if (x.c.reply_sink) expected += x.c.reply_sink->total_bytes();
    if (x.reply.status != 0 ? x.reply.payload_size > detail::max_failure_payload : x.reply.payload_size != expected)
      return fail(x, errc::peer_failure, std::string(x.reply.status != 0 ? "failure reply" : "reply") + " carries " +
                                             std::to_string(x.reply.payload_size) + " payload bytes, expected " +
                                             std::to_string(x.reply.status != 0 ? 0 : expected));
    x.c.reply_meta.resize(x.reply.meta_size);
    asio::async_read(x.p.socket, asio::buffer(x.c.reply_meta), [this, &x](std::error_code ec2, std::size_t) {
      if (ec2) return fail(x, errc::peer_failure, "connection lost while reading a reply: " + ec2.message());
      read_reply_payload(x);
    });
  });
}

inline void rpc_client::read_reply_payload(exchange& x) {
  if (x.reply.status != 0) {
    std::string reason = "request failed";
    try {
      reason = detail::decode_message<detail::refused_msg>(x.c.reply_meta, "failure").reason;
    } catch (const error&) {
    }
    if (!x.failure) {
      x.failure = error(static_cast<errc>(x.reply.status), x.p.describe() + ": " + detail::printable(reason, 4096));
      x.fatal = false;
    }
    x.done = true;
    return;
  }
  asio::async_read(x.p.socket, x.c.reply_payload, detail::transfer_all_large{},
                   [this, &x](std::error_code ec, std::size_t) {
    if (ec) return fail(x, errc::peer_failure, "connection lost while reading a reply payload: " + ec.message());
    if (x.c.reply_sink) return read_segment(x, 0);
    x.done = true;
  });
}

inline void rpc_client::connect(peer& p) {
  using namespace std::chrono;
  const auto deadline = steady_clock::now() + milliseconds(options_.connect_timeout_ms);
  const auto endpoint = detail::resolve_endpoint(io_, p.address);
  // A bounded pause before the next attempt (false: the deadline came first).
  const auto pause = [&](milliseconds length) {
    detail::steady_timer_on<detail::io_executor> timer(io_, length);
    bool fired = false;
    timer.async_wait([&](std::error_code) { fired = true; });
    if (!detail::run_until(io_, deadline, [&] { return fired; })) {
      timer.cancel();  // its handler writes `fired`: let it run before both go away
      detail::run_until(io_, steady_clock::now() + seconds(5), [&] { return fired; });
    }
  };
  auto backoff = milliseconds(20);
  for (;;) {
    if (p.socket.is_open()) p.socket.close();
    std::error_code result = asio::error::would_block;
    p.socket.async_connect(endpoint, [&](std::error_code ec) { result = ec; });
    if (!detail::run_until(io_, deadline, [&] { return result != asio::error::would_block; })) {
      p.socket.close();
      detail::run_until(io_, steady_clock::now() + seconds(5), [&] { return result != asio::error::would_block; });
      throw error(errc::timeout, p.describe() + ": not reachable within " +
                                     std::to_string(options_.connect_timeout_ms) + " ms");
    }
    std::string closed;
    if (!result) {
      p.socket.set_option(asio::ip::tcp::no_delay(true));
      if (handshake(p, std::min(deadline, steady_clock::now() + milliseconds(options_.handshake_timeout_ms)), closed))
        break;
    }
    // The peer is not listening yet (it may still be starting), or it closed the connection
    // before the handshake completed without a reason (its handshake budget taken by other
    // connections; rpc_server): wait, bounded, and try again.
    if (steady_clock::now() + backoff >= deadline)
      throw error(errc::timeout,
                  p.describe() + (result ? ": not reachable within " + std::to_string(options_.connect_timeout_ms) +
                                               " ms (last error: " + result.message() + ")"
                                         : ": no handshake completed within " +
                                               std::to_string(options_.connect_timeout_ms) + " ms (last attempt: " +
                                               closed + "; is its port crowded by other connections?)"));
    pause(backoff);
    backoff = std::min(backoff * 2, milliseconds(500));
  }
  p.connected = true;
}

// Drives the shared handshake machine with synchronous steps, each bounded by `deadline`; with
// TLS on, the TLS handshake first (a fresh TLS layer per connection), within the same deadline.
// True when done. False, with `closed` saying how, when the attempt ended without a refusal:
// the server closed the connection, or the deadline passed. A refusal with a reason throws.
inline bool rpc_client::handshake(peer& p, std::chrono::steady_clock::time_point deadline, std::string& closed) {
  p.socket.reset_tls();
  bool answered = false;  // the server sent a byte of the handshake: a close then is its refusal
  const auto finish = [&](std::error_code& result, const char* what, bool tls) {
    if (!detail::run_until(io_, deadline, [&] { return result != asio::error::would_block; })) {
      p.socket.close();
      detail::run_until(io_, std::chrono::steady_clock::now() + std::chrono::seconds(5),
                        [&] { return result != asio::error::would_block; });
      closed = std::string("timed out ") + what;
      return false;
    }
    if (!result) return true;
    p.socket.close();
    if (tls) answered = p.socket.handshake_bytes_in() > 0;
    if (!answered && (result == asio::error::eof || result == asio::error::connection_reset ||
                      result == asio::error::broken_pipe || result == asio::error::connection_aborted)) {
      closed = tls ? detail::tls_error_text(result) : "connection closed " + std::string(what);
      return false;
    }
    throw error(errc::peer_failure, p.describe() + ": " +
                                        (tls ? detail::tls_error_text(result)
                                             : "connection lost " + std::string(what) + ": " + result.message()));
  };
  if (tls_context_) {
    std::error_code result = asio::error::would_block;
    p.socket.start_tls(tls_context_.get(), detail::tls_role::client);
    p.socket.async_tls_handshake([&](std::error_code ec) { result = ec; });
    if (!finish(result, "in the TLS handshake", true)) return false;
  }
  detail::handshake h(detail::handshake::role::client, {options_.cluster_id, options_.identity, options_.secret,
                                                                   options_.task_key});
  std::vector<std::byte> in;
  for (;;) {
    const auto out = h.take_output();
    if (!out.empty()) {
      std::error_code result = asio::error::would_block;
      asio::async_write(p.socket, asio::buffer(out), [&](std::error_code ec, std::size_t) { result = ec; });
      if (!finish(result, "sending the handshake", false)) return false;
    }
    if (h.status() == detail::handshake::state::done) {
      // The task at this address must be the one this client means: a ps.1 reached at ps.0's
      // address (a wrong spec, a relay) is refused rather than sent ps.0's shards.
      if (h.peer_identity_raw() != p.name) {
        p.socket.close();
        throw error(errc::peer_failure, p.describe() + ": the server presented itself as '" + h.peer_identity() +
                                            "', not as '" + detail::printable(p.name) + "' (a wrong address?)");
      }
      return true;
    }
    if (h.status() == detail::handshake::state::failed) {
      p.socket.close();
      throw error(errc::peer_failure, p.describe() + ": " + h.failure());
    }
    in.resize(h.bytes_wanted());
    std::error_code result = asio::error::would_block;
    asio::async_read(p.socket, asio::buffer(in), [&](std::error_code ec, std::size_t) { result = ec; });
    if (!finish(result, "waiting for the handshake", false)) return false;
    answered = true;
    h.receive(in);
  }
}

}  // namespace dtf
