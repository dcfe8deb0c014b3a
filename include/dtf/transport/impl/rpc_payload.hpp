// dtf/transport/impl/rpc_payload.hpp — how an rpc_server session reads a request's payload
// (dtf/transport.hpp): into the connection's buffer, growing it as the bytes arrive; a piece at
// a time for a handler that takes it in pieces; or, refused before it was read, into a small
// buffer that drops it. The session itself: dtf/transport/impl/rpc_server.hpp.
#pragma once

#include <dtf/transport/impl/rpc_server.hpp>

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>

namespace dtf {

// The rest of the frame: the meta too unless on_meta read it (it did whenever the payload
// needs a larger buffer), then the payload.
template <class Handler>
void rpc_server<Handler>::session::read_body(bool with_meta) {
  if (!pieces_.ends.empty()) {
    piece_ = 0;
    pieces_failed_ = false;
    return read_piece();
  }
  if (header_.payload_size > payload_.size()) return read_growing(0);
  std::array bufs{with_meta ? asio::buffer(meta_) : asio::mutable_buffer(),
                  asio::buffer(payload_.data(), header_.payload_size)};
  asio::async_read(socket_, bufs, progress{this},
                   asio::bind_executor(strand_, [self = this->shared_from_this()](std::error_code e2, std::size_t) {
                     self->on_frame(e2);
                   }));
}

// A payload larger than the connection's buffer, read from byte `have` on: the buffer grows
// (doubling, from 64 KiB) only as bytes arrive, so an announcement costs nothing and a peer
// holds at most twice what it sent (and nothing once dropped for stalling).
template <class Handler>
void rpc_server<Handler>::session::read_growing(std::uint64_t have) {
  constexpr std::uint64_t first_growth = 64 * 1024;
  const std::uint64_t upto = std::min<std::uint64_t>(
      header_.payload_size, std::max<std::uint64_t>({std::uint64_t(payload_.size()), have * 2, first_growth}));
  if (upto > payload_.size()) {
    try {
      payload_.resize(upto);
    } catch (const std::bad_alloc&) {
      return refuse_payload("no memory for the " + std::to_string(header_.payload_size) +
                                " payload bytes of a request of kind " + std::to_string(int(header_.kind)),
                            header_.payload_size - have);
    }
  }
  asio::async_read(socket_, asio::buffer(payload_.data() + have, upto - have), progress{this},
                   asio::bind_executor(strand_, [self = this->shared_from_this(), upto](std::error_code ec, std::size_t) {
                     if (self->closed_) return;
                     if (ec || upto == self->header_.payload_size) return self->on_frame(ec);
                     self->read_growing(upto);
                   }));
}

// ---- a payload taken in pieces (rpc_pieces) -------------------------------------------------
template <class Handler>
void rpc_server<Handler>::session::read_piece() {
  const std::uint64_t begin = piece_ == 0 ? 0 : pieces_.ends[piece_ - 1];
  // The buffer grows a piece at a time (geometrically: std::vector's growth), as the bytes
  // come. Pieces handed over are applied at once (rpc_pieces), so none is held across a move.
  if (pieces_.ends[piece_] > payload_.size()) {
    try {
      payload_.resize(pieces_.ends[piece_]);
    } catch (const std::bad_alloc&) {
      // Pieces before this one may be applied: the connection ends, as a lost one would.
      return drop("no memory for piece " + std::to_string(piece_) + " of a request of kind " +
                  std::to_string(int(header_.kind)));
    }
  }
  asio::async_read(socket_, asio::buffer(payload_.data() + begin, pieces_.ends[piece_] - begin), progress{this},
                   asio::bind_executor(strand_, [self = this->shared_from_this()](std::error_code ec, std::size_t) {
                     self->on_piece(ec);
                   }));
}

template <class Handler>
void rpc_server<Handler>::session::on_piece(std::error_code ec) {
  if (closed_) return;
  if (ec) return drop("truncated frame: " + ec.message());
  const std::size_t i = piece_++;
  // The next piece's read is started first: its bytes arrive (into the socket's buffer, or
  // through another I/O thread) while this one is handed over.
  if (piece_ < pieces_.ends.size()) read_piece();
  if (!pieces_failed_) {
    const std::uint64_t begin = i == 0 ? 0 : pieces_.ends[i - 1];
    const auto bytes = std::span<std::byte>(payload_.data() + begin, pieces_.ends[i] - begin);
    pieces_failed_ = !handle([&](rpc_reply&) { pieces_.on_piece(i, bytes); }, pieces_reply_);
  }
  if (piece_ < pieces_.ends.size()) return;
  disarm();
  rpc_reply reply = std::move(pieces_reply_);
  if (!pieces_failed_) handle([&](rpc_reply& r) { pieces_.finish(r); }, reply);
  pieces_ = {};
  pieces_reply_ = {};
  if (reply.deferred) return;
  send_reply(std::move(reply));
}

// A request refused before its payload was read: its sender gets the reason at once, then
// the payload's bytes are read into a small fixed buffer and dropped (nothing is allocated for
// them; the frame deadline still bounds them), and the connection goes on.
template <class Handler>
void rpc_server<Handler>::session::refuse_payload(std::string why, std::uint64_t unread) {
  // Any connected peer may send such requests one after another: a line a second, with a count.
  server_.refusal_log_([&](const std::string& suppressed) {
    detail::log_line(server_.options_, "dtf " + server_.options_.identity + ": refused a request of '" +
                                           peer_.identity + "' unread: " + why + suppressed);
  });
  discard_ = unread;
  send_reply(rpc_reply::failure(errc::invalid_argument, std::move(why)));
}

template <class Handler>
void rpc_server<Handler>::session::discard_payload() {
  if (discard_ == 0) return read_header();
  sink_.resize(64 * 1024);
  const std::size_t n = std::size_t(std::min<std::uint64_t>(discard_, sink_.size()));
  asio::async_read(socket_, asio::buffer(sink_.data(), n),
                   asio::bind_executor(strand_, [self = this->shared_from_this()](std::error_code ec, std::size_t got) {
                     if (self->closed_) return;
                     if (ec) return self->drop("truncated frame: " + ec.message());
                     self->touch();
                     self->discard_ -= got;
                     self->discard_payload();
                   }));
}

}  // namespace dtf
