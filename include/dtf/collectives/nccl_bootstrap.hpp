// dtf/collectives/nccl_bootstrap.hpp — how the ranks of an NCCL communicator learn rank 0's
// ncclUniqueId: over dtf's TCP ring (authenticated by the cluster's secret, TLS with
// collective_options::tls), as one fixed-size frame that every other rank checks before the
// bytes reach NCCL (docs/design/gpu-execution.md, section 6.1).
//
//   dtf::collectives::nccl_id_bytes id{};
//   if (comm.rank() == 0) id = <ncclGetUniqueId's bytes>;
//   id = dtf::collectives::share_nccl_id(comm, id);   // rank 0's bytes on every rank
//
// The id is opaque (NCCL_UNIQUE_ID_BYTES, 128 bytes): this header needs no CUDA and no NCCL, so
// CPU builds compile and test the exchange. The frame is
//   [magic "dtfNCCL1", 8 bytes][the id's length, uint32 little-endian][4 zero bytes]
//   [the id, 128 bytes][FNV-1a of the id, uint64 little-endian]
// broadcast from rank 0 under the name nccl_id_collective. A peer whose frame has another size
// fails the ring's descriptor check; another magic, length or a wrong hash is
// errc::peer_failure naming rank 0 and the cause: a peer built against another NCCL or dtf
// never hands NCCL a wrong id (whose ncclCommInitRank would hang or fail obscurely).
//
// Errors: those of the ring (a dead or mismatched rank), prefixed with "NCCL bootstrap".
// Thread safety: the communicator's (one thread at a time).
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/detail/ring_schedule.hpp>
#include <dtf/error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace dtf::collectives {

/// The size of NCCL's unique id (NCCL_UNIQUE_ID_BYTES; checked against <nccl.h> where it is
/// included, dtf/collectives/nccl.hpp).
inline constexpr std::size_t nccl_id_size = 128;
/// An NCCL unique id as opaque bytes.
using nccl_id_bytes = std::array<std::byte, nccl_id_size>;
/// The name the frame travels under on the ring (its descriptor's tensor name).
inline constexpr std::string_view nccl_id_collective = "<nccl unique id>";

namespace detail {

inline constexpr std::array<char, 8> nccl_id_magic = {'d', 't', 'f', 'N', 'C', 'C', 'L', '1'};
/// The frame's size: magic, length, padding, id, hash.
inline constexpr std::size_t nccl_id_frame_size = 8 + 4 + 4 + nccl_id_size + 8;
using nccl_id_frame = std::array<std::uint8_t, nccl_id_frame_size>;

inline std::uint64_t nccl_id_hash(std::span<const std::byte> id) {
  return dtf::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(id.data()), id.size()));
}

// Little-endian whatever the host's order, so that ranks on different hosts agree.
inline void put_le(std::uint8_t* p, std::uint64_t v, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) p[i] = std::uint8_t(v >> (8 * i));
}
inline std::uint64_t get_le(const std::uint8_t* p, std::size_t bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v |= std::uint64_t(p[i]) << (8 * i);
  return v;
}

/// The frame rank 0 sends for `id`.
inline nccl_id_frame encode_nccl_id(const nccl_id_bytes& id) {
  nccl_id_frame f{};
  std::memcpy(f.data(), nccl_id_magic.data(), nccl_id_magic.size());
  put_le(f.data() + 8, nccl_id_size, 4);
  std::memcpy(f.data() + 16, id.data(), nccl_id_size);
  put_le(f.data() + 16 + nccl_id_size, nccl_id_hash(id), 8);
  return f;
}

/// The id in a frame received from `from` (e.g. "rank 0 (chief:0 at host:2222)"). Errors:
/// errc::peer_failure naming `from` and what is wrong with the frame.
inline nccl_id_bytes decode_nccl_id(const nccl_id_frame& f, const std::string& from) {
  const std::string prefix = "NCCL bootstrap: the unique id from " + from + " is malformed: ";
  if (std::memcmp(f.data(), nccl_id_magic.data(), nccl_id_magic.size()) != 0)
    throw error(errc::peer_failure, prefix + "not a dtf NCCL id frame (wrong magic; another dtf version?)");
  const std::uint64_t length = get_le(f.data() + 8, 4);
  if (length != nccl_id_size)
    throw error(errc::peer_failure, prefix + "an id of " + std::to_string(length) + " bytes, this build's NCCL uses " +
                                        std::to_string(nccl_id_size) + " (another NCCL version?)");
  if (get_le(f.data() + 12, 4) != 0) throw error(errc::peer_failure, prefix + "nonzero padding");
  nccl_id_bytes id{};
  std::memcpy(id.data(), f.data() + 16, nccl_id_size);
  if (get_le(f.data() + 16 + nccl_id_size, 8) != nccl_id_hash(id))
    throw error(errc::peer_failure, prefix + "its hash does not match its bytes (corrupted in transit)");
  return id;
}

/// The broadcast of a frame from rank 0 (its bytes in place everywhere); errors of the ring
/// prefixed with "NCCL bootstrap".
inline void broadcast_nccl_id_frame(communicator& ring, std::span<std::uint8_t> frame) {
  try {
    ring.broadcast(nccl_id_collective, frame, 0);
  } catch (const error& e) {
    throw error(e.code(), "NCCL bootstrap: the unique id's broadcast from " + ring.describe(0) + " failed: " + e.message());
  }
}

}  // namespace detail

/// Rank 0's `id` on every rank of `ring` (the other ranks' `id` is ignored); every rank calls it
/// at the same point of its collectives. Errors: see the file comment.
inline nccl_id_bytes share_nccl_id(communicator& ring, const nccl_id_bytes& id) {
  if (ring.size() == 1) return id;
  detail::nccl_id_frame frame{};
  if (ring.rank() == 0) frame = detail::encode_nccl_id(id);
  detail::broadcast_nccl_id_frame(ring, frame);
  return ring.rank() == 0 ? id : detail::decode_nccl_id(frame, ring.describe(0));
}

}  // namespace dtf::collectives
