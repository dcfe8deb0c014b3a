// dtf/detail/proto_writer.hpp — a minimal protocol-buffers wire-format writer.
//
// Enough of the encoding to write TensorBoard's Event/Summary/HistogramProto messages by hand
// (dtf does not depend on protobuf): varints, 64-bit and 32-bit fixed fields, length-delimited
// fields (strings, nested messages, packed repeated doubles). Field numbers and wire types
// follow https://protobuf.dev/programming-guides/encoding/.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dtf::detail {

class proto_writer {
 public:
  enum wire : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

  void add_varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(std::byte((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(std::byte(v));
  }
  void add_key(std::uint32_t field, wire w) { add_varint((std::uint64_t(field) << 3) | w); }

  /// int64 field (two's complement as a 10-byte varint when negative, as protobuf does).
  void int64_field(std::uint32_t field, std::int64_t v) {
    add_key(field, varint);
    add_varint(static_cast<std::uint64_t>(v));
  }
  void double_field(std::uint32_t field, double v) {
    add_key(field, fixed64);
    add_fixed(std::bit_cast<std::uint64_t>(v), 8);
  }
  void float_field(std::uint32_t field, float v) {
    add_key(field, fixed32);
    add_fixed(std::bit_cast<std::uint32_t>(v), 4);
  }
  void bytes_field(std::uint32_t field, std::span<const std::byte> b) {
    add_key(field, length_delimited);
    add_varint(b.size());
    out_.insert(out_.end(), b.begin(), b.end());
  }
  void string_field(std::uint32_t field, std::string_view s) {
    bytes_field(field, std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  void message_field(std::uint32_t field, const proto_writer& m) { bytes_field(field, m.bytes()); }
  /// A packed repeated double field.
  void packed_doubles(std::uint32_t field, std::span<const double> v) {
    add_key(field, length_delimited);
    add_varint(v.size() * 8);
    for (double d : v) add_fixed(std::bit_cast<std::uint64_t>(d), 8);
  }

  std::span<const std::byte> bytes() const noexcept { return out_; }

 private:
  void add_fixed(std::uint64_t v, int n) {  // little-endian, whatever the host
    for (int i = 0; i < n; ++i) out_.push_back(std::byte((v >> (8 * i)) & 0xFF));
  }
  std::vector<std::byte> out_;
};

}  // namespace dtf::detail
