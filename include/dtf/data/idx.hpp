// dtf/data/idx.hpp — reader for IDX files (the MNIST / Fashion-MNIST format), plain or
// gzip-compressed.
//
// Format: two zero bytes, a type code (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32,
// 0x0E f64), the number of dimensions, then each dimension as a big-endian u32, then the
// elements, big-endian, row-major. zlib reads both compressed and uncompressed files.
//
// Errors (dtf::error naming the file): errc::io_error when the file cannot be opened;
// errc::corrupt_data for a wrong magic number, an unknown type code, a truncated file, a
// corrupt gzip stream, or trailing bytes after the elements.
#pragma once

#include <dtf/error.hpp>

#include <zlib.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace dtf::data {

/// Element type codes of the IDX format.
enum class idx_type : std::uint8_t { u8 = 0x08, i8 = 0x09, i16 = 0x0B, i32 = 0x0C, f32 = 0x0D, f64 = 0x0E };

/// The contents of an IDX file, converted to host byte order.
struct idx_array {
  /// The element type.
  idx_type type = idx_type::u8;
  /// The dimensions.
  std::vector<std::size_t> shape;
  std::vector<std::uint8_t> bytes;  ///< elements in host byte order, row-major

  /// The number of elements (the product of the dimensions).
  std::size_t size() const {
    std::size_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  /// The elements converted to T.
  template <class T>
  std::vector<T> as() const;
};

/// Bytes per element of an IDX element type.
inline std::size_t idx_element_size(idx_type t) {
  switch (t) {
    case idx_type::u8: case idx_type::i8: return 1;
    case idx_type::i16: return 2;
    case idx_type::i32: case idx_type::f32: return 4;
    case idx_type::f64: return 8;
  }
  return 0;
}

template <class T>
std::vector<T> idx_array::as() const {
  const std::size_t n = size();
  std::vector<T> out(n);
  auto convert = [&]<class S>(S) {
    for (std::size_t i = 0; i < n; ++i) {
      S v;
      std::memcpy(&v, bytes.data() + i * sizeof(S), sizeof(S));
      out[i] = static_cast<T>(v);
    }
  };
  switch (type) {
    case idx_type::u8: convert(std::uint8_t{}); break;
    case idx_type::i8: convert(std::int8_t{}); break;
    case idx_type::i16: convert(std::int16_t{}); break;
    case idx_type::i32: convert(std::int32_t{}); break;
    case idx_type::f32: convert(float{}); break;
    case idx_type::f64: convert(double{}); break;
  }
  return out;
}

namespace detail {
struct gz_closer {
  void operator()(gzFile f) const { gzclose(f); }
};

inline void gz_read_exact(gzFile f, void* dst, std::size_t n, const std::string& path, const char* what) {
  auto* out = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const unsigned chunk = n > (1u << 30) ? (1u << 30) : unsigned(n);
    const int got = gzread(f, out, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw error(errc::corrupt_data, path + ": corrupt gzip stream while reading " + what + " (" + msg + ")");
    }
    if (got == 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw error(errc::corrupt_data, path + ": file is truncated: ended while reading " + what +
                                          (code != Z_OK && msg && *msg ? std::string(" (") + msg + ")" : ""));
    }
    out += got;
    n -= std::size_t(got);
  }
}
}  // namespace detail

/// Reads a whole IDX file (".gz" or not; detected from the content, not the name).
inline idx_array read_idx(const std::string& path) {
  std::unique_ptr<gzFile_s, detail::gz_closer> f(gzopen(path.c_str(), "rb"));
  if (!f) throw error(errc::io_error, path + ": cannot open IDX file (" + std::strerror(errno) + ")");
  gzbuffer(f.get(), 1 << 17);

  unsigned char magic[4];
  detail::gz_read_exact(f.get(), magic, 4, path, "the magic number");
  const unsigned code = magic[2];
  const bool known_type = code == 0x08 || code == 0x09 || code == 0x0B || code == 0x0C || code == 0x0D || code == 0x0E;
  if (magic[0] != 0 || magic[1] != 0 || !known_type || magic[3] == 0) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%02x%02x%02x%02x", magic[0], magic[1], magic[2], magic[3]);
    throw error(errc::corrupt_data, path + ": wrong magic number 0x" + buf +
                                        " (an IDX file starts with 0x0000, a type code 08/09/0b/0c/0d/0e and a "
                                        "dimension count)");
  }
  idx_array a;
  a.type = idx_type(code);
  std::size_t total = 1;
  for (unsigned i = 0; i < magic[3]; ++i) {
    unsigned char d[4];
    detail::gz_read_exact(f.get(), d, 4, path, "the dimensions");
    const std::size_t dim = (std::size_t(d[0]) << 24) | (std::size_t(d[1]) << 16) | (std::size_t(d[2]) << 8) | d[3];
    a.shape.push_back(dim);
    total *= dim;
    if (total > (std::size_t(1) << 40))
      throw error(errc::corrupt_data, path + ": dimensions " + std::to_string(total) + "+ elements are implausible");
  }
  const std::size_t esize = idx_element_size(a.type);
  a.bytes.resize(total * esize);
  detail::gz_read_exact(f.get(), a.bytes.data(), a.bytes.size(), path, "the elements");
  if constexpr (std::endian::native == std::endian::little) {
    if (esize > 1)
      for (std::size_t i = 0; i < total; ++i) {
        unsigned char* e = a.bytes.data() + i * esize;
        for (std::size_t j = 0; j < esize / 2; ++j) std::swap(e[j], e[esize - 1 - j]);
      }
  }
  unsigned char extra;
  const int more = gzread(f.get(), &extra, 1);
  if (more < 0) {
    int c = 0;
    throw error(errc::corrupt_data, path + ": corrupt gzip stream after the elements (" + gzerror(f.get(), &c) + ")");
  }
  if (more > 0)
    throw error(errc::corrupt_data, path + ": trailing bytes after the " + std::to_string(total) + " elements");
  return a;
}

}  // namespace dtf::data
