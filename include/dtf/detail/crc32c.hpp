// dtf/detail/crc32c.hpp — CRC-32C (Castagnoli), as TFRecord framing uses it.
//
// Table-driven, one byte at a time: summaries are small and written every few hundred steps,
// so simplicity beats a hardware (SSE4.2) path here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace dtf::detail {

inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli polynomial
    t[i] = c;
  }
  return t;
}();

/// CRC-32C of `data`, continuing from `crc` (0 to start).
inline std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
  for (std::byte b : data) crc = crc32c_table[(crc ^ std::uint32_t(b)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

/// TFRecord's masked CRC: rotated right by 15 bits plus a constant, so that a CRC stored
/// inside checksummed data does not checksum to a trivial value.
inline std::uint32_t masked_crc32c(std::span<const std::byte> data) noexcept {
  const std::uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

}  // namespace dtf::detail
