// dtf/transport/credentials.hpp — the keys that bind a task's identity to what it can prove
// (docs/design/identity.md): a master secret M held by the launcher and the ps tasks, a task key
// K(id) = HMAC-SHA256(M, "dtf task key v1" ‖id‖) held by the one task named id, and a ring key
// R = HMAC-SHA256(M, "dtf ring key v1") shared by the ranks of a collective job, and the ps key
// Kps = HMAC-SHA256(M, "dtf ps key v1") that only the ps hold (synchronous proofs).
//
// The handshake (dtf/transport/handshake.hpp) and TLS (dtf/transport/tls.hpp) key every
// connection with K(client identity): a client uses its own task key, or derives it when it holds
// M; a server derives it from M and the identity presented. Knowing any number of task keys says
// nothing about M or another identity's key (HMAC is a pseudo-random function).
//
// Also here: reading a secret from a file (owner-only, never a flag value) and the minimum length.
//
// Thread safety: every function is reentrant.
#pragma once

#include <dtf/detail/hmac.hpp>
#include <dtf/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

namespace dtf {

/// The shortest master secret dtf's programs accept (bytes). A shorter one is guessable from a
/// recorded handshake (the HMACs and the TLS binder allow offline guessing).
inline constexpr std::size_t min_secret_bytes = 16;

/// What a task proves its identity with. Both empty: no authentication.
struct credentials {
  /// The master secret M (a ps, the launcher, or every task of a shared-secret cluster).
  std::string secret;
  /// This task's own key K(identity) (64 hex digits), used when `secret` is empty.
  std::string task_key;
  bool empty() const noexcept { return secret.empty() && task_key.empty(); }  ///< no credential: no authentication
};

namespace detail {

/// `text` prefixed with its length, so that no two splits of the same bytes into fields collide.
inline std::string framed(std::string_view text) { return std::to_string(text.size()) + ":" + std::string(text); }

inline std::string to_hex(const digest& d) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (const auto b : d) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

}  // namespace detail

/// K(identity) of master secret `master`, as 64 lower-case hex digits. Errors:
/// errc::invalid_config for an empty master.
inline std::string derive_task_key(std::string_view master, std::string_view identity) {
  if (master.empty()) throw error(errc::invalid_config, "a task key is derived from the master secret, which is empty");
  return detail::to_hex(detail::hmac_sha256(master, {"dtf task key v1", detail::framed(identity)}));
}

/// R of master secret `master`, as 64 lower-case hex digits: the ring's shared key.
inline std::string derive_ring_key(std::string_view master) {
  if (master.empty()) throw error(errc::invalid_config, "the ring key is derived from the master secret, which is empty");
  return detail::to_hex(detail::hmac_sha256(master, {"dtf ring key v1"}));
}

/// Kps of master secret `master`, as 64 lower-case hex digits: the key only the ps tasks hold,
/// under which ps 0 signs synchronous decisions and ps p signs receipts of staged parts
/// (docs/design/sync-protocol.md): a worker can carry them, not make them.
inline std::string derive_ps_key(std::string_view master) {
  if (master.empty()) throw error(errc::invalid_config, "the ps key is derived from the master secret, which is empty");
  return detail::to_hex(detail::hmac_sha256(master, {"dtf ps key v1"}));
}

/// The key a client named `identity` proves itself with: its own task key, or K(identity)
/// derived from the master it holds; empty without credentials.
inline std::string client_key(const credentials& c, std::string_view identity) {
  if (!c.task_key.empty()) return c.task_key;
  if (!c.secret.empty()) return derive_task_key(c.secret, identity);
  return {};
}

/// Refuses a master secret shorter than min_secret_bytes (errc::invalid_config naming `what`).
inline void check_secret_length(std::string_view secret, const std::string& what) {
  if (!secret.empty() && secret.size() < min_secret_bytes)
    throw error(errc::invalid_config, what + ": the secret has " + std::to_string(secret.size()) +
                                          " bytes; at least " + std::to_string(min_secret_bytes) +
                                          " are required (e.g. openssl rand -hex 32)");
}

/// Reads a secret from `path`: a regular file owned by this user, readable by no one else
/// (mode 0600 or stricter), not a symbolic link, at most 4 KiB; one trailing newline is dropped.
/// Errors: errc::invalid_config naming the path and the cause.
inline std::string read_secret_file(const std::string& path) {
  auto bad = [&](const std::string& why) { throw error(errc::invalid_config, "secret file " + path + ": " + why); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) bad(errno == ELOOP ? "is a symbolic link" : std::strerror(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_it{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) bad(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) bad("is not a regular file");
  if (st.st_uid != ::geteuid()) bad("is owned by uid " + std::to_string(st.st_uid) + ", not by this user");
  if ((st.st_mode & 077) != 0) bad("is readable or writable by others (chmod 600 it)");
  if (st.st_size > 4096) bad("is larger than 4 KiB");
  std::string text(std::size_t(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const auto n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) bad("cannot be read");
    got += std::size_t(n);
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) bad("is empty");
  return text;
}

}  // namespace dtf
