// dtf/detail/ring_schedule.hpp — what a rank sends and receives at each step of a ring
// collective, the per-collective descriptor that travels ahead of the data, and the
// reduction kernels.
//
// A collective on one directed ring connection (rank -> rank+1) is a stream:
//   [frame header, kind collective][96-byte descriptor][data bytes in schedule order]
// The descriptor lets the receiver refuse a collective that does not match its own (another
// tensor, element count, dtype, op or algorithm) with an error naming the rank and tensor
// before a single data byte is interpreted. Nothing waits for the descriptor to be
// acknowledged: a mismatch is found by the receiver, which fails and closes its connections,
// and the failure propagates around the ring.
#pragma once

#include <dtf/detail/frame.hpp>
#include <dtf/dtype.hpp>
#include <dtf/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace dtf {

/// How allreduce combines the ranks' values.
enum class reduce_op : std::uint8_t {
  sum = 1,
  average = 2,  ///< the sum divided by the number of ranks (integer division for integer dtypes)
  min = 3,
  max = 4,
};

inline std::string_view name_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::average: return "average";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
  }
  return "unknown";
}

}  // namespace dtf

namespace dtf::detail {

enum class collective_kind : std::uint8_t { allreduce = 1, broadcast = 2, allgather = 3 };
/// small: every rank's whole buffer travels around the ring (n-1 steps, one latency each);
/// ring: reduce-scatter + allgather (2(n-1) steps, 2(n-1)/n of the data per rank).
enum class ring_algorithm : std::uint8_t { ring = 1, small = 2, recursive_doubling = 3, halving_doubling = 4 };

inline std::string_view name_of(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::allreduce: return "allreduce";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::allgather: return "allgather";
  }
  return "collective";
}

inline constexpr std::size_t descriptor_size = 96;
inline constexpr std::size_t descriptor_name_bytes = 64;
inline constexpr std::size_t collective_header_size = frame_header_size + descriptor_size;

inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (const unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

/// The elements of `type` in `bytes` bytes of collective `name`. Errors: invalid_argument when
/// bytes is not a whole number of them.
inline std::uint64_t elements_of(std::string_view name, dtype type, std::size_t bytes) {
  if (size_of(type) == 0 || bytes % size_of(type) != 0)
    throw error(errc::invalid_argument, "collective on '" + std::string(name) + "': " + std::to_string(bytes) +
                                            " bytes is not a whole number of " + std::string(dtf::name_of(type)));
  return bytes / size_of(type);
}

/// What a rank is about to do; every rank of a collective must agree on all of it but origin.
struct collective_descriptor {
  std::uint64_t sequence = 0;  ///< collectives on this communicator before this one
  std::uint32_t origin = 0;    ///< the rank that wrote it
  std::uint32_t world = 0;
  collective_kind kind = collective_kind::allreduce;
  dtype type = dtype::float32;
  reduce_op op = reduce_op::sum;
  ring_algorithm algorithm = ring_algorithm::ring;
  std::uint64_t count = 0;  ///< elements per rank
  std::uint32_t root = 0;   ///< broadcast only
  std::string name;         ///< at most descriptor_name_bytes are sent; the hash covers all of it
  std::uint64_t name_hash = 0;

  /// Collective number `sequence` of rank `origin` in a world of `world` ranks: count
  /// elements of `type` under `name` (name_hash: fnv1a(name), passed when already known).
  static collective_descriptor make(std::uint64_t sequence, std::size_t origin, std::size_t world,
                                    collective_kind kind, std::string_view name, std::uint64_t name_hash, dtype type,
                                    std::uint64_t count, reduce_op op = reduce_op::sum, std::size_t root = 0) {
    collective_descriptor d;
    d.sequence = sequence;
    d.origin = std::uint32_t(origin);
    d.world = std::uint32_t(world);
    d.kind = kind;
    d.type = type;
    d.op = op;
    d.count = count;
    d.root = std::uint32_t(root);
    d.name = std::string(name);
    d.name_hash = name_hash;
    return d;
  }

  std::string describe() const {
    std::string s = std::string(detail::name_of(kind)) + " of '" + name + "' (" + std::to_string(count) + " " +
                    std::string(dtf::name_of(type));
    if (kind == collective_kind::allreduce) s += ", " + std::string(dtf::name_of(op));
    if (kind == collective_kind::broadcast) s += ", root " + std::to_string(root);
    return s + ")";
  }
};

inline std::array<std::byte, collective_header_size> encode_descriptor(const collective_descriptor& d,
                                                                       std::uint64_t payload_bytes) {
  frame_header h;
  h.kind = message_kind::collective;
  h.meta_size = std::uint32_t(descriptor_size);
  h.request_id = d.sequence;
  h.payload_size = payload_bytes;
  std::array<std::byte, collective_header_size> out{};
  const auto fh = encode_header(h);
  std::memcpy(out.data(), fh.data(), fh.size());
  std::byte* m = out.data() + frame_header_size;
  wire::put<std::uint32_t>(m + 0, d.origin);
  m[4] = std::byte(d.kind);
  m[5] = std::byte(d.type);
  m[6] = std::byte(d.op);
  m[7] = std::byte(d.algorithm);
  wire::put<std::uint64_t>(m + 8, d.count);
  wire::put<std::uint64_t>(m + 16, d.name_hash);
  wire::put<std::uint32_t>(m + 24, d.root);
  wire::put<std::uint32_t>(m + 28, d.world);
  const std::size_t n = std::min(d.name.size(), descriptor_name_bytes);
  std::memcpy(m + 32, d.name.data(), n);
  return out;
}

/// Decodes a descriptor received from `who`; a stream that is not a collective header (a
/// stranger, a desynchronised peer) is errc::peer_failure naming `who`.
inline collective_descriptor decode_descriptor(std::span<const std::byte, collective_header_size> b,
                                               const std::string& who) {
  frame_header h;
  try {
    h = decode_header(b.first<frame_header_size>(), frame_limits{descriptor_size, ~std::uint64_t(0)});
  } catch (const error& e) {
    throw error(errc::peer_failure, who + ": malformed collective header: " + e.message());
  }
  if (h.kind != message_kind::collective || h.meta_size != descriptor_size)
    throw error(errc::peer_failure, who + ": expected a collective header, got message kind " +
                                        std::to_string(unsigned(h.kind)));
  collective_descriptor d;
  const std::byte* m = b.data() + frame_header_size;
  d.sequence = h.request_id;
  d.origin = wire::get<std::uint32_t>(m + 0);
  d.kind = collective_kind(m[4]);
  d.type = dtype(m[5]);
  d.op = reduce_op(m[6]);
  d.algorithm = ring_algorithm(m[7]);
  d.count = wire::get<std::uint64_t>(m + 8);
  d.name_hash = wire::get<std::uint64_t>(m + 16);
  d.root = wire::get<std::uint32_t>(m + 24);
  d.world = wire::get<std::uint32_t>(m + 28);
  const char* name = reinterpret_cast<const char*>(m + 32);
  d.name.assign(name, strnlen(name, descriptor_name_bytes));
  return d;
}

/// Throws errc::invalid_argument naming the other rank and both tensors when `theirs` does
/// not describe the same collective as `mine`.
inline void check_descriptor(const collective_descriptor& mine, const collective_descriptor& theirs,
                             const std::string& rank_name) {
  std::string what;
  if (theirs.world != mine.world)
    what = "a world of " + std::to_string(theirs.world) + " ranks, this rank " + std::to_string(mine.world);
  else if (theirs.sequence != mine.sequence)
    what = "collective #" + std::to_string(theirs.sequence) + ", this rank #" + std::to_string(mine.sequence) +
           " (one rank skipped or added a collective)";
  else if (theirs.kind != mine.kind)
    what = std::string(name_of(theirs.kind)) + " where this rank calls " + std::string(name_of(mine.kind));
  else if (theirs.name_hash != mine.name_hash)
    what = "tensor '" + theirs.name + "' where this rank has '" + mine.name + "'";
  else if (theirs.type != mine.type)
    what = "dtype " + std::string(dtf::name_of(theirs.type)) + ", this rank " + std::string(dtf::name_of(mine.type));
  else if (theirs.count != mine.count)
    what = std::to_string(theirs.count) + " elements, this rank " + std::to_string(mine.count);
  else if (theirs.op != mine.op)
    what = "op " + std::string(dtf::name_of(theirs.op)) + ", this rank " + std::string(dtf::name_of(mine.op));
  else if (theirs.root != mine.root)
    what = "root " + std::to_string(theirs.root) + ", this rank " + std::to_string(mine.root);
  else if (theirs.algorithm != mine.algorithm)
    what = "another algorithm (its collective_options differ: small_bytes or hypercube)";
  if (!what.empty())
    throw error(errc::invalid_argument, "mismatched collective on tensor '" + mine.name + "': " + rank_name + " calls " +
                                            theirs.describe() + ", this rank " + mine.describe() + ": it has " + what);
}

/// Element range [begin, end) of chunk i when `count` elements are split over n chunks: the
/// first count % n chunks get one extra element.
struct chunk_range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const noexcept { return end - begin; }
};
inline chunk_range chunk_of(std::size_t count, std::size_t n, std::size_t i) {
  const std::size_t base = count / n, extra = count % n;
  const std::size_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

/// One step of a ring schedule: bytes to send to the right neighbour and bytes to receive
/// from the left one, concurrently. A gated step sends only what the previous step has made
/// final (received, and reduced where it reduces), so a chunk moves on segment by segment
/// as soon as it is ready; its send size then equals the previous step's receive size.
struct ring_step {
  const std::byte* send = nullptr;
  std::size_t send_bytes = 0;
  std::byte* recv = nullptr;
  std::size_t recv_bytes = 0;
  bool gated = false;
  std::byte* reduce_into = nullptr;  ///< received bytes are combined into this (recv is staging)
  std::size_t divide_by = 0;         ///< with reduce_into: divide each reduced range by this (average)
  bool windowed = false;  ///< with reduce_into: recv is a window of 2 segments reused in turn
  std::function<void()> on_received;  ///< runs once all recv_bytes are in (and reduced)

  /// Sends `data` whole and receives as many bytes into `into` (a pairwise exchange).
  static ring_step exchange(std::span<const std::byte> data, std::byte* into) {
    ring_step st;
    st.send = data.data();
    st.send_bytes = data.size();
    st.recv = into;
    st.recv_bytes = data.size();
    return st;
  }
};

/// dst[i] = op(dst[i], src[i]) over `bytes` bytes of elements.
using reduce_fn = void (*)(std::byte* dst, const std::byte* src, std::size_t bytes);

template <class T, reduce_op Op>
void reduce_kernel(std::byte* dst, const std::byte* src, std::size_t bytes) {
  const std::size_t n = bytes / sizeof(T);
  T* __restrict d = reinterpret_cast<T*>(dst);
  const T* __restrict s = reinterpret_cast<const T*>(src);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (Op == reduce_op::sum || Op == reduce_op::average)
      d[i] = d[i] + s[i];
    else if constexpr (Op == reduce_op::min)
      d[i] = s[i] < d[i] ? s[i] : d[i];
    else
      d[i] = s[i] > d[i] ? s[i] : d[i];
  }
}

template <class T>
reduce_fn reduce_for(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::average: return &reduce_kernel<T, reduce_op::sum>;
    case reduce_op::min: return &reduce_kernel<T, reduce_op::min>;
    case reduce_op::max: return &reduce_kernel<T, reduce_op::max>;
  }
  throw error(errc::invalid_argument, "unknown reduce_op " + std::to_string(int(op)));
}

inline reduce_fn reduce_for(dtype t, reduce_op op) {
  switch (t) {
    case dtype::float32: return reduce_for<float>(op);
    case dtype::float64: return reduce_for<double>(op);
    case dtype::int32: return reduce_for<std::int32_t>(op);
    case dtype::int64: return reduce_for<std::int64_t>(op);
    case dtype::uint8: return reduce_for<std::uint8_t>(op);
  }
  throw error(errc::invalid_argument, "unknown dtype " + std::to_string(int(t)));
}

/// data[i] /= n over `bytes` bytes of elements (the last step of reduce_op::average).
using scale_fn = void (*)(std::byte* data, std::size_t bytes, std::size_t n);

template <class T>
void scale_kernel(std::byte* data, std::size_t bytes, std::size_t n) {
  T* p = reinterpret_cast<T*>(data);
  const std::size_t count = bytes / sizeof(T);
  for (std::size_t i = 0; i < count; ++i) p[i] = T(p[i] / T(n));
}

inline scale_fn scale_for(dtype t) {
  switch (t) {
    case dtype::float32: return &scale_kernel<float>;
    case dtype::float64: return &scale_kernel<double>;
    case dtype::int32: return &scale_kernel<std::int32_t>;
    case dtype::int64: return &scale_kernel<std::int64_t>;
    case dtype::uint8: return &scale_kernel<std::uint8_t>;
  }
  throw error(errc::invalid_argument, "unknown dtype " + std::to_string(int(t)));
}

}  // namespace dtf::detail
