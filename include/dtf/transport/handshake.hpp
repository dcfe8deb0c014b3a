// dtf/transport/handshake.hpp — the dtf connection handshake as one state machine, bytes in
// and bytes out, used by both socket kinds (the Asio request/reply transport of
// dtf/transport.hpp and the POSIX ring sockets of dtf/detail/ring_handshake.hpp).
//
//   client                                   server
//   hello {protocol, cluster id, identity, nonce_c, authenticate}  ->
//                     <-  refused {reason}  |  welcome {identity}  |  challenge {nonce_s}
//   auth {HMAC(K, "dtf-client v2" nonce_s nonce_c ‖cluster_id‖ ‖client id‖)}  ->
//                     <-  refused {reason}  |  welcome {server id, HMAC(K, "dtf-server v2" nonce_c nonce_s
//                                                        ‖cluster_id‖ ‖client id‖ ‖server id‖)}
//
// K is the client's task key K(client id) (dtf/transport/credentials.hpp): the client holds it
// (or the master secret it is derived from), the server derives it from the master secret and
// the identity presented. So only a holder of that identity's key can complete the handshake
// under that identity, and the identity a server acts on is the authenticated one. Both sides
// prove the key with fresh nonces (a recorded handshake cannot be replayed); the labels differ
// by direction and the server's proof names both identities and the cluster id (‖x‖: x with its
// length). Without credentials the handshake only checks the protocol version and the cluster
// id, and identities are self-declared. The handshake authenticates who connects; it does not
// protect the bytes that follow (see docs/guides/security.md, docs/design/identity.md).
//
// The machine never reads past its own frames: bytes_wanted() says exactly how many bytes the
// next step needs, so the data that follows the handshake stays in the socket. Handshake frames
// carry no payload and at most max_handshake_meta control bytes, so a stranger cannot make a
// task allocate more than that.
//
// A refused peer learns why in general terms (wrong secret, another cluster, another protocol)
// but never this cluster's id; the full reason, with the peer's text escaped, is failure().
//
// Thread safety: one object per connection, used by one thread at a time.
#pragma once

#include <dtf/detail/archive.hpp>
#include <dtf/detail/frame.hpp>
#include <dtf/detail/hmac.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/error.hpp>
#include <dtf/transport/credentials.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dtf::detail {

/// The largest control message a handshake frame may carry (a hello with a long identity).
inline constexpr std::uint32_t max_handshake_meta = 4096;

/// Peer-supplied text made safe to log: printable ASCII kept, anything else (newlines, terminal
/// escapes, bytes >= 0x80) as \xNN, backslashes doubled, at most `max_chars` characters of input
/// (then "...").
inline std::string printable(std::string_view text, std::size_t max_chars = 128) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (text.size() > max_chars) out += "...";
  return out;
}

/// A refusal frame carrying `reason` (what a refused peer is told).
inline std::vector<std::byte> refusal_frame(const std::string& reason) {
  const auto meta = encode_message(refused_msg{reason});
  frame_header h;
  h.kind = message_kind::refused;
  h.meta_size = std::uint32_t(meta.size());
  const auto header = encode_header(h);
  std::vector<std::byte> out(header.size() + meta.size());
  std::copy(header.begin(), header.end(), out.begin());
  std::copy(meta.begin(), meta.end(), out.begin() + std::ptrdiff_t(header.size()));
  return out;
}

/// Who this end of a connection is.
struct handshake_config {
  std::string cluster_id;  ///< server: empty accepts any cluster id
  std::string identity;    ///< "worker.0"
  std::string secret;      ///< the master secret (a server needs it to authenticate clients)
  std::string task_key;    ///< client: this identity's own key, used when `secret` is empty
};

/// One side of the handshake. Feed it exactly bytes_wanted() bytes at a time from the socket
/// and send what take_output() returns (before reading again, and once more after it stops).
class handshake {
 public:
  enum class role { client, server };
  enum class state {
    running,  ///< wants bytes (bytes_wanted() > 0) or has output to send
    done,     ///< authenticated; peer_identity() is set
    failed,   ///< failure() says why; take_output() may still hold a refusal to send
  };

  handshake(role r, handshake_config config) : role_(r), config_(std::move(config)) {
    if (role_ == role::client) {
      hello_.cluster_id = config_.cluster_id;
      hello_.identity = config_.identity;
      hello_.nonce = random_nonce();
      key_ = client_key({config_.secret, config_.task_key}, config_.identity);
      hello_.authenticate = !key_.empty();
      emit(message_kind::hello, encode_message(hello_));
    }
  }

  state status() const noexcept { return state_; }
  /// Bytes the next step needs (0 once done or failed).
  std::size_t bytes_wanted() const noexcept {
    if (state_ != state::running) return 0;
    return (have_header_ ? header_.meta_size : frame_header_size) - in_.size();
  }
  /// Consumes `bytes` (at most bytes_wanted()).
  void receive(std::span<const std::byte> bytes) {
    if (bytes.size() > bytes_wanted()) throw error(errc::internal, "handshake: fed past the frame");
    in_.insert(in_.end(), bytes.begin(), bytes.end());
    if (!have_header_) {
      if (in_.size() < frame_header_size) return;
      try {
        header_ = decode_header(std::span<const std::byte, frame_header_size>(in_.data(), frame_header_size),
                                frame_limits{max_handshake_meta, 0});
      } catch (const error& e) {
        // A TLS record (a ClientHello: 0x16 0x03) where a dtf hello belongs.
        if (role_ == role::server && in_[0] == std::byte{0x16} && in_[1] == std::byte{0x03})
          // Told in a plain frame: a byte back lets the TLS client tell this refusal from a
          // server that closed without answering (which it retries).
          return fail("the peer speaks TLS and this task does not (transport_options::tls, --tls): turn TLS on "
                      "for every task or none",
                      "this task runs without TLS: turn TLS on for every task or none");
        return fail(std::string("malformed handshake: ") + e.message(), {});
      }
      have_header_ = true;
      in_.clear();
      if (header_.meta_size > 0) return;
    }
    if (in_.size() < header_.meta_size) return;
    std::vector<std::byte> meta = std::move(in_);
    in_.clear();
    have_header_ = false;
    try {
      role_ == role::client ? client_step(meta) : server_step(meta);
    } catch (const error& e) {
      fail("malformed handshake: " + e.message(), {});
    }
  }
  /// The bytes to send now (moved out).
  std::vector<std::byte> take_output() { return std::exchange(out_, {}); }

  /// The reason of a failure, peer text escaped (for logs and errors).
  const std::string& failure() const noexcept { return failure_; }
  /// The identity the peer presented, escaped; "" before its first frame.
  const std::string& peer_identity() const noexcept { return peer_identity_; }
  /// The identity exactly as presented (to match against expected names, never to log).
  const std::string& peer_identity_raw() const noexcept { return peer_identity_raw_; }

 private:
  void emit(message_kind kind, const std::vector<std::byte>& meta) {
    frame_header h;
    h.kind = kind;
    h.meta_size = std::uint32_t(meta.size());
    const auto header = encode_header(h);
    out_.insert(out_.end(), header.begin(), header.end());
    out_.insert(out_.end(), meta.begin(), meta.end());
  }
  void fail(std::string reason, std::string tell_peer) {
    failure_ = std::move(reason);
    if (!tell_peer.empty()) {
      const auto frame = refusal_frame(tell_peer);
      out_.insert(out_.end(), frame.begin(), frame.end());
    }
    state_ = state::failed;
  }
  void refuse(const std::string& reason) { fail("refused: " + reason, reason); }

  void client_step(const std::vector<std::byte>& meta) {
    if (header_.kind == message_kind::refused)
      return fail("refused the connection: " + printable(decode_message<refused_msg>(meta, "refusal").reason, 512), {});
    if (header_.kind == message_kind::challenge && !challenged_) {
      if (key_.empty()) return fail("challenged but no secret is set", {});
      challenged_ = true;
      server_nonce_ = decode_message<challenge_msg>(meta, "challenge").nonce;
      emit(message_kind::auth, encode_message(auth_msg{client_proof(hello_.cluster_id, hello_.identity)}));
      return;
    }
    if (header_.kind != message_kind::welcome) return fail("unexpected handshake message", {});
    const auto welcome = decode_message<welcome_msg>(meta, "welcome");
    peer_identity_raw_ = welcome.identity;
    peer_identity_ = printable(welcome.identity);
    if (!key_.empty()) {
      if (!challenged_) return fail("the server did not authenticate (it has no secret)", {});
      if (!digests_equal(welcome.mac, server_proof(hello_.cluster_id, hello_.identity, welcome.identity)))
        return fail("the server failed to prove it knows the cluster secret", {});
    }
    state_ = state::done;
  }

  void server_step(const std::vector<std::byte>& meta) {
    if (!challenged_) {
      if (header_.kind != message_kind::hello) return fail("first frame is not a hello", {});
      hello_ = decode_message<hello_msg>(meta, "hello");
      peer_identity_raw_ = hello_.identity;
      peer_identity_ = printable(hello_.identity);
      if (hello_.protocol != protocol_version)
        return refuse("protocol version " + std::to_string(hello_.protocol) + " (this task speaks " +
                      std::to_string(protocol_version) + ")");
      // The peer learns that its id is wrong, never which id is right.
      if (!config_.cluster_id.empty() && hello_.cluster_id != config_.cluster_id)
        return refuse("cluster id '" + printable(hello_.cluster_id) + "' is not this cluster's");
      if (config_.secret.empty()) {
        if (!config_.task_key.empty())
          return fail("this task holds only its own key, not the master secret that authenticates peers", {});
        if (hello_.authenticate) return refuse("this task has no cluster secret configured");
        emit(message_kind::welcome, encode_message(welcome_msg{config_.identity, {}}));
        state_ = state::done;
        return;
      }
      if (!hello_.authenticate) return refuse("authentication required: the peer presented no cluster secret");
      key_ = derive_task_key(config_.secret, hello_.identity);
      server_nonce_ = random_nonce();
      challenged_ = true;
      emit(message_kind::challenge, encode_message(challenge_msg{server_nonce_}));
      return;
    }
    if (header_.kind != message_kind::auth) return fail("expected the authentication reply", {});
    const auto auth = decode_message<auth_msg>(meta, "auth");
    // Another secret, or a key that is not this identity's: the peer may present only the
    // identity its key names.
    if (!digests_equal(auth.mac, client_proof(hello_.cluster_id, hello_.identity)))
      return refuse("wrong cluster secret, or a key that is not '" + printable(hello_.identity) + "''s");
    emit(message_kind::welcome, encode_message(welcome_msg{config_.identity, server_proof(hello_.cluster_id, hello_.identity,
                                                                                         config_.identity)}));
    state_ = state::done;
  }

  // Both proofs over K(client): the client's binds the cluster id and its identity; the
  // server's, the other direction, adds the server's identity.
  digest client_proof(const std::string& cluster_id, const std::string& client) const {
    return hmac_sha256(key_, {"dtf-client v2", as_view(server_nonce_), as_view(hello_.nonce), framed(cluster_id),
                              framed(client)});
  }
  digest server_proof(const std::string& cluster_id, const std::string& client, const std::string& server) const {
    return hmac_sha256(key_, {"dtf-server v2", as_view(hello_.nonce), as_view(server_nonce_), framed(cluster_id),
                              framed(client), framed(server)});
  }

  role role_;
  handshake_config config_;
  state state_ = state::running;
  std::vector<std::byte> in_, out_;
  frame_header header_{};
  bool have_header_ = false, challenged_ = false;
  hello_msg hello_;
  digest server_nonce_{};
  std::string failure_, peer_identity_, peer_identity_raw_;
  std::string key_;  // K(client identity); empty without credentials
};

}  // namespace dtf::detail
