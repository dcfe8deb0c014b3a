// libFuzzer target for the wire decoders: the frame header and every control message.
// Whatever the bytes, decoding either succeeds or throws dtf::error; it never crashes, reads
// out of bounds or allocates what a length field claims without the bytes to back it.
#include <dtf/detail/archive.hpp>
#include <dtf/detail/frame.hpp>
#include <dtf/detail/messages.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace {
template <class T>
void try_decode(std::span<const std::byte> bytes) {
  try {
    (void)dtf::detail::decode_message<T>(bytes, "fuzz");
  } catch (const dtf::error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dtf::detail;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  if (size >= frame_header_size) {
    try {
      const auto h = decode_header(bytes.first<frame_header_size>(), frame_limits{});
      // A valid header: decode what follows as the control message its kind announces.
      const auto rest = bytes.subspan(frame_header_size);
      const auto meta = rest.first(std::min<std::size_t>(h.meta_size, rest.size()));
      switch (h.kind) {
        case message_kind::hello: try_decode<hello_msg>(meta); break;
        case message_kind::challenge: try_decode<challenge_msg>(meta); break;
        case message_kind::auth: try_decode<auth_msg>(meta); break;
        case message_kind::welcome: try_decode<welcome_msg>(meta); break;
        case message_kind::refused: try_decode<refused_msg>(meta); break;
        case message_kind::ps_init: try_decode<ps_init_msg>(meta); break;
        case message_kind::ps_pull: try_decode<ps_pull_msg>(meta); break;
        case message_kind::ps_push: try_decode<ps_push_msg>(meta); break;
        case message_kind::ps_save: try_decode<ps_save_msg>(meta); break;
        case message_kind::ps_restore: try_decode<ps_restore_msg>(meta); break;
        case message_kind::ps_embedding_init: try_decode<ps_embedding_init_msg>(meta); break;
        case message_kind::ps_gather: try_decode<ps_gather_msg>(meta); break;
        case message_kind::ps_sparse_push: try_decode<ps_sparse_push_msg>(meta); break;
        case message_kind::ps_sparse_stats: try_decode<ps_sparse_stats_msg>(meta); break;
        case message_kind::ps_sparse_restore: try_decode<ps_sparse_restore_msg>(meta); break;
        case message_kind::ps_positions: try_decode<ps_positions_msg>(meta); break;
        case message_kind::ps_buffers: try_decode<ps_buffers_msg>(meta); break;
        case message_kind::ps_sync_push:
        case message_kind::ps_sync_stage: try_decode<ps_sync_push_msg>(meta); break;
        case message_kind::ps_sync_apply:
        case message_kind::ps_sync_decision: try_decode<ps_sync_apply_msg>(meta); break;
        case message_kind::ps_sync_hold: try_decode<ps_sync_hold_msg>(meta); break;
        default: try_decode<ps_status_msg>(meta); break;
      }
    } catch (const dtf::error&) {
    }
  }
  // Every decoder on the raw bytes too.
  try_decode<hello_msg>(bytes);
  try_decode<welcome_msg>(bytes);
  try_decode<refused_msg>(bytes);
  try_decode<ps_init_msg>(bytes);
  try_decode<ps_push_msg>(bytes);
  try_decode<ps_sync_apply_msg>(bytes);
  try_decode<ps_save_msg>(bytes);
  try_decode<ps_saved_msg>(bytes);
  try_decode<ps_restore_msg>(bytes);
  try_decode<ps_embedding_init_msg>(bytes);
  try_decode<ps_sparse_push_msg>(bytes);
  try_decode<ps_sparse_stats_msg>(bytes);
  try_decode<ps_sparse_restore_msg>(bytes);
  try_decode<ps_positions_msg>(bytes);
  return 0;
}
