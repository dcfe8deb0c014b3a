// dtf/detail/frame.hpp — the wire frame: a fixed 32-byte header, a control message (cereal,
// at most max_meta_bytes) and a raw payload (tensor bytes, sent and received in place).
//
//   offset size field
//   0      4    magic "DTF1" (0x31465444 little-endian)
//   4      2    protocol version
//   6      2    kind (message_kind)
//   8      4    meta_size: bytes of the control message that follows the header
//   12     4    status: 0, or an errc value in a reply that reports a failure
//   16     8    request_id: echoed by the reply
//   24     8    payload_size: raw bytes after the control message
// Integers are little-endian on the wire.
#pragma once

#include <dtf/error.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>

namespace dtf::detail {

inline constexpr std::uint32_t frame_magic = 0x31465444;  // "DTF1"
inline constexpr std::uint16_t protocol_version = 7;  // 7: rule_msg::weight_decay, optim::adamw
inline constexpr std::size_t frame_header_size = 32;

enum class message_kind : std::uint16_t {
  // handshake
  hello = 1,
  challenge = 2,
  auth = 3,
  welcome = 4,
  refused = 5,
  heartbeat = 6,  ///< after the handshake: keeps an idle connection alive (answered by a reply)
  // parameter server
  ps_init = 16,
  ps_ready = 17,
  ps_pull = 18,
  ps_push = 19,
  ps_step = 20,
  ps_shutdown = 21,
  ps_done = 22,
  ps_sync_push = 23,
  // checkpoints (issue 7: 24..39)
  ps_save = 24,
  ps_restore = 25,
  ps_done_tasks = 26,  // announce / learn the tasks that reported done (ps_done_tasks_msg both ways)
  // sparse variables (dtf/ps/sparse_client.hpp)
  ps_embedding_init = 27,
  ps_gather = 28,
  ps_sparse_push = 29,
  ps_sparse_stats = 30,
  ps_sparse_restore = 31,  // rows of a checkpoint's table (ps_sparse_restore_msg)
  // checkpoints, continued
  ps_positions = 32,  // training tasks' data positions, kept on ps 0 (ps_positions_msg both ways)
  // the synchronous protocol (dtf/ps/sync_protocol.hpp); ps_sync_push is its commit
  ps_sync_stage = 33,     // a contribution's part, staged on ps p > 0 (ps_sync_push_msg)
  ps_sync_apply = 34,     // apply a decided step (ps_sync_apply_msg), to ps p > 0
  ps_sync_decision = 35,  // the decision of a step, from ps 0 (ps_sync_apply_msg, ids empty)
  ps_sync_hold = 36,      // the chief, for a checkpoint: ps 0 stops or resumes deciding (ps_sync_hold_msg)
  ps_buffers = 37,        // the chief's model buffers, kept on ps 0 for the workers (ps_buffers_msg both ways)
  // collectives (dtf/collectives.hpp); 40..59 are reserved for them
  collective = 40,           ///< per-collective descriptor on a ring connection, then raw data
  rendezvous_register = 41,  ///< MPI rendezvous: a rank's listening port, to rank 0
  rendezvous_table = 42,     ///< MPI rendezvous: every rank's address, from rank 0
  reply = 64,
};

inline bool is_known_kind(std::uint16_t k) {
  return (k >= 1 && k <= 6) || (k >= 16 && k <= 37) || (k >= 40 && k <= 42) || k == 64;
}

struct frame_limits {
  std::uint32_t max_meta_bytes = 64 * 1024;
  std::uint64_t max_payload_bytes = std::uint64_t(1) << 32;
};

struct frame_header {
  std::uint16_t version = protocol_version;
  message_kind kind = message_kind::reply;
  std::uint32_t meta_size = 0;
  std::uint32_t status = 0;
  std::uint64_t request_id = 0;
  std::uint64_t payload_size = 0;
};

namespace wire {
template <class T>
T byteswap(T v) {  // std::byteswap is C++23
  T out;
  const auto* in = reinterpret_cast<const unsigned char*>(&v);
  auto* o = reinterpret_cast<unsigned char*>(&out);
  for (std::size_t i = 0; i < sizeof(T); ++i) o[i] = in[sizeof(T) - 1 - i];
  return out;
}
template <class T>
void put(std::byte* p, T v) {
  if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
  std::memcpy(p, &v, sizeof v);
}
template <class T>
T get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
  return v;
}
}  // namespace wire

inline std::array<std::byte, frame_header_size> encode_header(const frame_header& h) {
  std::array<std::byte, frame_header_size> b{};
  wire::put<std::uint32_t>(&b[0], frame_magic);
  wire::put<std::uint16_t>(&b[4], h.version);
  wire::put<std::uint16_t>(&b[6], static_cast<std::uint16_t>(h.kind));
  wire::put<std::uint32_t>(&b[8], h.meta_size);
  wire::put<std::uint32_t>(&b[12], h.status);
  wire::put<std::uint64_t>(&b[16], h.request_id);
  wire::put<std::uint64_t>(&b[24], h.payload_size);
  return b;
}

/// Decodes and validates a header. Errors (errc::corrupt_data) name the fault: bad magic
/// (a stranger speaking another protocol), unsupported version, unknown kind, control
/// message or payload larger than the limits.
inline frame_header decode_header(std::span<const std::byte, frame_header_size> b, const frame_limits& limits) {
  const auto magic = wire::get<std::uint32_t>(&b[0]);
  if (magic != frame_magic) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", magic);
    throw error(errc::corrupt_data, std::string("bad frame magic 0x") + buf + " (not a dtf peer)");
  }
  frame_header h;
  h.version = wire::get<std::uint16_t>(&b[4]);
  if (h.version != protocol_version)
    throw error(errc::corrupt_data, "protocol version " + std::to_string(h.version) + " (this build speaks " +
                                        std::to_string(protocol_version) + ")");
  const auto kind = wire::get<std::uint16_t>(&b[6]);
  if (!is_known_kind(kind)) throw error(errc::corrupt_data, "unknown message kind " + std::to_string(kind));
  h.kind = static_cast<message_kind>(kind);
  h.meta_size = wire::get<std::uint32_t>(&b[8]);
  h.status = wire::get<std::uint32_t>(&b[12]);
  h.request_id = wire::get<std::uint64_t>(&b[16]);
  h.payload_size = wire::get<std::uint64_t>(&b[24]);
  if (h.meta_size > limits.max_meta_bytes)
    throw error(errc::corrupt_data, "control message of " + std::to_string(h.meta_size) + " bytes exceeds the limit of " +
                                        std::to_string(limits.max_meta_bytes));
  if (h.payload_size > limits.max_payload_bytes)
    throw error(errc::corrupt_data, "payload of " + std::to_string(h.payload_size) + " bytes exceeds the limit of " +
                                        std::to_string(limits.max_payload_bytes));
  return h;
}

}  // namespace dtf::detail
