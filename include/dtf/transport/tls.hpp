// dtf/transport/tls.hpp — optional TLS 1.3 on the request/reply transport (dtf/transport.hpp)
// and on the collectives' ring sockets: the key, the OpenSSL context settings, one end of a TLS
// connection as a bytes-in/bytes-out machine (tls_channel; dtf/transport/impl/stream.hpp drives
// it with Asio, dtf/detail/ring_tls.hpp with non-blocking POSIX sockets) and the reasons a TLS
// handshake fails.
//
// Design (what a security reviewer should check)
//
// - Off by default (transport_options::tls, --tls, DTF_TLS=1). When on, a connection is TLS
//   1.3 from its first byte: the TLS handshake, then dtf's HMAC handshake
//   (dtf/transport/handshake.hpp) and every frame inside TLS records. TLS 1.3 only (no
//   downgrade to 1.2 or below), one cipher suite: TLS_AES_128_GCM_SHA256 (AEAD: every record is
//   encrypted and authenticated; the record sequence numbers make a replayed, dropped,
//   reordered or modified record fail the connection).
// - No certificates: an external pre-shared key (RFC 8446 §2.2, OpenSSL's TLS 1.3 PSK session
//   callbacks) derived with HKDF-SHA256 (RFC 5869; salt "dtf tls psk v2", info the cluster id)
//   from the client's task key K(client) (dtf/transport/credentials.hpp, docs/design/identity.md):
//   the trust model is the HMAC handshake's. The PSK identity on the wire is "dtf-psk-v2:" and
//   the client's task name (not secret); a server derives that name's key from the master
//   secret. Both ends prove knowledge of the key in the handshake (the PSK binder and the
//   Finished messages), so there is no unauthenticated key exchange: an active attacker without
//   the key can neither complete a handshake nor sit in the middle. A client refuses a server
//   that completes the handshake any other way (a certificate fails verification against an
//   empty trust store; tls_channel checks that the PSK was used), so an impostor at a task's
//   address learns nothing inside TLS. The key is bound to the cluster id: a task of another
//   cluster with the same secret fails the TLS handshake. The secret and keys never cross the
//   wire.
// - Forward secrecy: psk_dhe_ke only (SSL_OP_ALLOW_NO_DHE_KEX is cleared): every connection
//   also runs an ephemeral (EC)DHE exchange (X25519 by default), so a secret that leaks later
//   does not decrypt recorded traffic (it does let its holder join the cluster, as today).
// - No session tickets (resumption would add state and nothing the PSK does not give), no
//   0-RTT early data (replayable by design).
// - No downgrade between modes: TLS is required on both sides when on. A server with TLS looks
//   at a new connection's first byte: a plain dtf hello is answered with a plain refusal
//   ("this task requires TLS") and dropped with a logged reason; a server without TLS that
//   receives a TLS ClientHello drops it naming the cause; a client with TLS reports a server
//   that does not speak TLS, or has another key, by name (tls_failure_reason below).
// - An empty secret cannot turn TLS on (errc::invalid_config): a key from no secret would be
//   public and the encryption decorative.
// - Deadlines: the TLS handshake counts against handshake_timeout_ms like the dtf handshake.
// - The secret must be high-entropy (e.g. `openssl rand -hex 32`): the PSK binder in the
//   ClientHello, like the HMACs of the plain handshake, lets someone who recorded a handshake
//   test guesses of the secret offline. TLS does not hide sizes or timing: an observer
//   still sees how many bytes pass when.
//
// - The same on the ring sockets of the collective strategies (collective_options::tls): every
//   connection a communicator opens between ranks (ring neighbours, hypercube partners, the MPI
//   rendezvous) is TLS from its first byte with this key, these context settings and this
//   machine (tls_channel), driven through non-blocking POSIX sockets by dtf/detail/ring_tls.hpp
//   and dtf/detail/ring_handshake.hpp; a TLS rank and a plain rank refuse each other the same way.
//
// Thread safety: the functions are reentrant; an SSL_CTX configured here may be shared by the
// connections of several threads (OpenSSL's rule for SSL_CTX after set-up).
#pragma once

#include <dtf/error.hpp>
#include <dtf/transport/credentials.hpp>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

namespace dtf::detail {

/// The label that salts the key derivation, and the prefix of the PSK identity sent in the
/// ClientHello (followed by the client's task name, whose key K(name) the PSK is derived from).
inline constexpr std::string_view tls_psk_label = "dtf tls psk v2";
inline constexpr std::string_view tls_psk_identity = "dtf-psk-v2:";
inline constexpr const char* tls_ciphersuite = "TLS_AES_128_GCM_SHA256";
/// The first byte of a TLS record carrying a handshake message (a ClientHello starts so).
inline constexpr unsigned char tls_handshake_record = 0x16;

using tls_key = std::array<unsigned char, 32>;

/// dtf's own reason code (outside OpenSSL's): the server finished the handshake without the PSK.
inline constexpr int tls_reason_server_without_psk = 0x7ff001;

/// HKDF-SHA256 of the cluster secret, salt tls_psk_label, info the cluster id. Errors:
/// errc::invalid_config for an empty secret; errc::internal when OpenSSL fails.
inline tls_key derive_tls_key(std::string_view secret, std::string_view cluster_id) {
  if (secret.empty())
    throw error(errc::invalid_config, "TLS needs a cluster secret (--secret or DTF_CLUSTER_SECRET): "
                                      "its key is derived from it");
  tls_key key{};
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr),
                                                                   &EVP_PKEY_CTX_free);
  std::size_t length = key.size();
  const auto bytes = [](std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); };
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) <= 0 || EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), bytes(tls_psk_label), int(tls_psk_label.size())) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), bytes(secret), int(secret.size())) <= 0 ||
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), bytes(cluster_id), int(cluster_id.size())) <= 0 ||
      EVP_PKEY_derive(ctx.get(), key.data(), &length) <= 0 || length != key.size())
    throw error(errc::internal, "HKDF-SHA256 of the TLS key failed in OpenSSL");
  return key;
}

enum class tls_role { client, server };

namespace tls_impl {

// What a context keys connections with, in the SSL_CTX's extra data (its own index), freed and
// wiped with the context. A client holds the PSK of its own identity; a server the master secret,
// from which it derives the PSK of the identity a client names.
struct keys {
  tls_key client_psk{};
  std::string psk_identity;  // client: tls_psk_identity + its name
  std::string master;        // server
  std::string cluster_id;    // server
  ~keys() {
    OPENSSL_cleanse(client_psk.data(), client_psk.size());
    if (!master.empty()) OPENSSL_cleanse(master.data(), master.size());
  }
};

inline void free_key(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) { delete static_cast<keys*>(ptr); }

inline int key_index() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, &free_key);
  return index;
}

// A PSK is presented to OpenSSL as a TLS 1.3 session holding the key as its master key.
// OpenSSL takes ownership of the returned session.
inline const keys* keys_of(SSL* ssl) {
  return static_cast<const keys*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), key_index()));
}

inline SSL_SESSION* psk_session(SSL* ssl, const tls_key& key) {
  static constexpr unsigned char aes128gcm_sha256[] = {0x13, 0x01};
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, aes128gcm_sha256);
  if (!cipher) return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  if (s && SSL_SESSION_set1_master_key(s, key.data(), key.size()) == 1 && SSL_SESSION_set_cipher(s, cipher) == 1 &&
      SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) == 1)
    return s;
  SSL_SESSION_free(s);
  return nullptr;
}

inline int use_session(SSL* ssl, const EVP_MD* md, const unsigned char** id, std::size_t* id_length,
                       SSL_SESSION** session) {
  *session = nullptr;
  // A second call (after a HelloRetryRequest) names the hash the server chose: ours is SHA-256.
  if (md && EVP_MD_get_type(md) != NID_sha256) return 1;
  const keys* k = keys_of(ssl);
  if (!k) return 0;
  *session = psk_session(ssl, k->client_psk);
  *id = reinterpret_cast<const unsigned char*>(k->psk_identity.data());
  *id_length = k->psk_identity.size();
  return *session ? 1 : 0;
}

inline int find_session(SSL* ssl, const unsigned char* id, std::size_t id_length, SSL_SESSION** session) {
  *session = nullptr;
  const keys* k = keys_of(ssl);
  const std::string_view presented(reinterpret_cast<const char*>(id), id_length);
  // An unknown identity: no PSK, and with no certificate the handshake then fails.
  if (!k || !presented.starts_with(tls_psk_identity) || presented.size() > 4096) return 1;
  try {
    const auto name = presented.substr(tls_psk_identity.size());
    *session = psk_session(ssl, derive_tls_key(derive_task_key(k->master, name), k->cluster_id));
  } catch (const error&) {
    return 0;
  }
  return *session ? 1 : 0;
}

}  // namespace tls_impl

/// Sets up `ctx` for dtf's TLS as `role` (see the design above) for the task named `identity`
/// with credentials `creds` in cluster `cluster_id`: a client keys its connections with its own
/// K(identity) (docs/design/identity.md); a server derives the key of the identity each client
/// names from the master secret. Errors: errc::invalid_config without credentials, or for a
/// server without the master secret; errc::internal when OpenSSL refuses a setting.
inline void configure_tls(SSL_CTX* ctx, tls_role role, const credentials& creds, std::string_view identity,
                          std::string_view cluster_id) {
  auto key = std::make_unique<tls_impl::keys>();
  if (role == tls_role::client) {
    key->client_psk = derive_tls_key(client_key(creds, identity), cluster_id);
    key->psk_identity = std::string(tls_psk_identity) + std::string(identity);
  } else {
    if (creds.secret.empty() && !creds.task_key.empty())
      throw error(errc::invalid_config, "a TLS server needs the cluster's master secret: this task holds only its "
                                        "own key");
    (void)derive_tls_key(creds.secret, cluster_id);  // the same error as a client's for no secret
    key->master = creds.secret;
    key->cluster_id = std::string(cluster_id);
  }
  const int index = tls_impl::key_index();
  if (index < 0 || SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) != 1 || SSL_CTX_set_ciphersuites(ctx, tls_ciphersuite) != 1 ||
      SSL_CTX_set_num_tickets(ctx, 0) != 1 || SSL_CTX_set_ex_data(ctx, index, key.get()) != 1)
    throw error(errc::internal, "OpenSSL refused dtf's TLS settings");
  key.release();  // owned by ctx now (tls_impl::free_key)
  SSL_CTX_clear_options(ctx, SSL_OP_ALLOW_NO_DHE_KEX);  // (EC)DHE on every connection: forward secrecy
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_max_early_data(ctx, 0);
  if (role == tls_role::client) {
    // The PSK authenticates both ends. A server that answers with a certificate instead has not
    // proven the key: verified against an empty trust store, every certificate fails (and
    // tls_channel checks after the handshake that the PSK was used).
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_psk_use_session_callback(ctx, &tls_impl::use_session);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
    SSL_CTX_set_psk_find_session_callback(ctx, &tls_impl::find_session);
  }
}

/// Why a TLS handshake failed, for a log line or an error: `reason` is OpenSSL's reason code
/// (ERR_GET_REASON), 0 when the connection just ended; `detail` OpenSSL's own text.
inline std::string tls_failure_reason(int reason, const std::string& detail) {
  std::string why;
  switch (reason) {
    case 0:
      why = "the peer closed the connection in the TLS handshake (does it run without TLS? TLS must be on for "
            "every task or none)";
      break;
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_HTTP_REQUEST:
      why = "the peer does not speak TLS (it runs without TLS: TLS must be on for every task or none)";
      break;
    case SSL_R_BINDER_DOES_NOT_VERIFY:  // the server's view
    case SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER:  // the client's: the alert a failed binder sends
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
    case SSL_R_DECRYPTION_FAILED_OR_BAD_RECORD_MAC:
      why = "the TLS key does not match: the peer has another cluster secret or cluster id";
      break;
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
      why = "the peer does not offer TLS 1.3";
      break;
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
    case tls_reason_server_without_psk:
      why = "the server did not prove the cluster key (it answered without dtf's pre-shared key: not a dtf task, "
            "or an impostor at its address)";
      break;
    case SSL_R_NO_SHARED_CIPHER:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
      why = "no dtf pre-shared key was offered or accepted (not a dtf TLS peer, or another dtf version)";
      break;
    default:
      why = "TLS handshake failed";
  }
  return detail.empty() ? why : why + " [" + detail + "]";
}

/// What a TLS end tells a peer that connected without TLS (in clear, as a dtf refusal, so
/// that the peer's error says why).
inline constexpr const char* tls_required_refusal =
    "this task requires TLS (--tls, DTF_TLS=1; transport_options::tls, collective_options::tls): turn TLS on "
    "for every task or none";

/// An owned SSL_CTX set up by configure_tls (null: TLS off).
struct ssl_ctx_free {
  void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
};
using tls_context = std::unique_ptr<SSL_CTX, ssl_ctx_free>;

/// The context of one end of dtf's TLS, or null when `on` is false. Errors: those of
/// configure_tls.
inline tls_context make_tls_context(bool on, tls_role role, const credentials& creds, std::string_view identity,
                                   std::string_view cluster_id) {
  if (!on) return nullptr;
  tls_context ctx(SSL_CTX_new(role == tls_role::client ? TLS_client_method() : TLS_server_method()));
  if (!ctx) throw error(errc::internal, "SSL_CTX_new failed in OpenSSL");
  configure_tls(ctx.get(), role, creds, identity, cluster_id);
  return ctx;
}

/// OpenSSL's packed error codes (ERR_get_error) as std::error_code values.
class tls_error_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dtf.tls"; }
  std::string message(int code) const override {
    char text[256];
    ERR_error_string_n(static_cast<unsigned long>(code), text, sizeof text);
    return text;
  }
};
inline const std::error_category& tls_category() {
  static const tls_error_category category;
  return category;
}

/// The reason (tls_failure_reason) of a tls_channel failure (failure_code()).
inline std::string tls_channel_failure_text(const std::error_code& ec) {
  if (ec.category() != tls_category()) return "TLS failed: " + ec.message();
  const int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
  return tls_failure_reason(reason == SSL_R_UNEXPECTED_EOF_WHILE_READING ? 0 : reason, ec.message());
}

/// One end of a TLS connection as a machine, bytes in and bytes out (like dtf's handshake):
/// ciphertext from the socket goes in through feed(), ciphertext to send comes out of output();
/// plaintext goes through write() and read(). It never touches a socket, so the caller keeps
/// its own I/O model (Asio here). Thread safety: one object per connection, one thread at a time.
class tls_channel {
 public:
  enum class status { done, want_read, closed, failed };

  tls_channel(SSL_CTX* ctx, tls_role role) : ssl_(SSL_new(ctx)), client_(role == tls_role::client) {
    BIO* in = BIO_new(BIO_s_mem());
    BIO* out = BIO_new(BIO_s_mem());
    if (!ssl_ || !in || !out) {
      BIO_free(in);
      BIO_free(out);
      throw error(errc::internal, "SSL_new failed in OpenSSL");
    }
    BIO_set_mem_eof_return(in, -1);  // no ciphertext yet: "want read", not end of stream
    SSL_set_bio(ssl_.get(), in, out);  // owned by ssl_ now
    in_ = in;
    out_ = out;
    role == tls_role::client ? SSL_set_connect_state(ssl_.get()) : SSL_set_accept_state(ssl_.get());
  }

  /// Advances the handshake; send output() after it whatever it returns.
  status handshake() {
    ERR_clear_error();
    const int rc = SSL_do_handshake(ssl_.get());
    if (rc != 1) return classify(rc);
    // A client trusts only a server that proved the pre-shared key (TLS 1.3 reports an accepted
    // external PSK as a resumption); anything else is an impostor, refused before a byte is sent.
    if (client_ && SSL_session_reused(ssl_.get()) != 1) {
      error_ = ERR_PACK(ERR_LIB_USER, 0, tls_reason_server_without_psk);
      return status::failed;
    }
    return status::done;
  }
  /// Ciphertext that arrived.
  void feed(const void* data, std::size_t n) {
    if (n > 0 && BIO_write(in_, data, int(n)) != int(n)) throw error(errc::internal, "BIO_write failed in OpenSSL");
  }
  /// Encrypts all of `n` plaintext bytes into output(); false on failure (failure_code() says why).
  bool write(const void* data, std::size_t n) {
    ERR_clear_error();
    std::size_t written = 0;
    if (n == 0 || (SSL_write_ex(ssl_.get(), data, n, &written) == 1 && written == n)) return true;
    classify(0);
    return false;
  }
  /// Decrypts up to `n` bytes; 0 with `s` saying why none (want_read: feed more ciphertext).
  std::size_t read(void* data, std::size_t n, status& s) {
    ERR_clear_error();
    std::size_t got = 0;
    if (SSL_read_ex(ssl_.get(), data, n, &got) == 1) return got;
    s = classify(0);
    return 0;
  }
  /// The ciphertext to send (valid until consume_output() or the next call that encrypts).
  std::span<const std::byte> output() const {
    char* data = nullptr;
    const long n = BIO_get_mem_data(out_, &data);
    return {reinterpret_cast<const std::byte*>(data), n > 0 ? std::size_t(n) : 0};
  }
  void consume_output() { (void)BIO_reset(out_); }
  /// The failure of the last call that failed (tls_category()).
  std::error_code failure_code() const { return {int(error_), tls_category()}; }

 private:
  status classify(int rc) {
    switch (SSL_get_error(ssl_.get(), rc)) {
      case SSL_ERROR_WANT_READ:
        return status::want_read;
      case SSL_ERROR_ZERO_RETURN:
        return status::closed;
      default:
        error_ = ERR_peek_last_error();
        if (error_ == 0) error_ = ERR_PACK(ERR_LIB_SSL, 0, SSL_R_UNEXPECTED_EOF_WHILE_READING);
        ERR_clear_error();
        return status::failed;
    }
  }

  struct ssl_free {
    void operator()(SSL* s) const noexcept { SSL_free(s); }
  };
  std::unique_ptr<SSL, ssl_free> ssl_;
  BIO* in_ = nullptr;   // owned by ssl_
  BIO* out_ = nullptr;  // owned by ssl_
  bool client_ = false;
  unsigned long error_ = 0;
};

}  // namespace dtf::detail
