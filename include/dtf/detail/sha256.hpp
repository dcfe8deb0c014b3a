// dtf/detail/sha256.hpp — incremental SHA-256 (OpenSSL libcrypto) for checkpoint checksums.
#pragma once

#include <dtf/error.hpp>

#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dtf::detail {

/// SHA-256 over any number of byte ranges; hex() ends it. Not thread-safe.
class sha256 {
 public:
  sha256() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      throw error(errc::internal, "SHA-256: EVP_DigestInit_ex failed");
  }
  void update(const void* data, std::size_t n) {
    if (n != 0 && EVP_DigestUpdate(ctx_.get(), data, n) != 1) throw error(errc::internal, "SHA-256: update failed");
  }
  /// The digest as 64 lowercase hex digits (call once).
  std::string hex() {
    std::array<unsigned char, EVP_MAX_MD_SIZE> d{};
    unsigned len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), d.data(), &len) != 1 || len != 32)
      throw error(errc::internal, "SHA-256: final failed");
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (unsigned i = 0; i < len; ++i) {
      out += digits[d[i] >> 4];
      out += digits[d[i] & 15];
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

inline std::string sha256_hex(const void* data, std::size_t n) {
  sha256 h;
  h.update(data, n);
  return h.hex();
}

}  // namespace dtf::detail
