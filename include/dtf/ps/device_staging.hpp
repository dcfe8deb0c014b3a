// dtf/ps/device_staging.hpp — how a ps client moves device memory: one staging buffer (and copy
// engine) per ps connection, and the pipelines of dtf/detail/staging_pipeline.hpp presented to
// the transport as segmented payloads and replies (dtf/transport.hpp).
//
// A connection's staging buffer holds that ps's shards back to back, in the order of the
// request, so one buffer of the largest message sent to or read from that ps serves every
// request; it is allocated on first use and kept.
// Thread safety: as the ps_client that owns it (one thread).
#pragma once

#include <dtf/detail/staging_pipeline.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace dtf::detail {

/// The device byte ranges of a ps's shards (offsets from the start of the flat float buffer).
inline std::vector<staged_range> shard_ranges(const placement& layout, std::span<const std::uint32_t> ids) {
  std::vector<staged_range> r;
  r.reserve(ids.size());
  for (auto id : ids) r.push_back({layout.shards[id].offset * sizeof(float), layout.shards[id].size * sizeof(float)});
  return r;
}

/// staged_send as a transport payload (segment k+1 is copied while segment k is written).
template <staging_copy_engine Engine>
class staged_payload final : public payload_segments {
 public:
  staged_payload(Engine& e, const std::byte* device, std::span<const staged_range> ranges, std::size_t segment_bytes)
      : send_(e, device, ranges, segment_bytes) {
    send_.begin();  // segment 0 is copied while the frame's header goes out
  }
  std::size_t total_bytes() const override { return send_.total_bytes(); }
  std::size_t count() const override { return send_.count(); }
  std::span<const std::byte> segment(std::size_t k) override { return send_.segment(k); }

 private:
  staged_send<Engine> send_;
};

/// staged_receive as a transport reply sink (segment k is copied while k+1 is read).
template <staging_copy_engine Engine>
class staged_reply final : public reply_segments {
 public:
  staged_reply(Engine& e, std::byte* device, std::span<const staged_range> ranges, std::size_t segment_bytes)
      : receive_(e, device, ranges, segment_bytes) {}
  std::size_t total_bytes() const override { return receive_.total_bytes(); }
  std::size_t count() const override { return receive_.count(); }
  std::span<std::byte> segment(std::size_t k) override { return receive_.segment(k); }
  void received(std::size_t k) override { receive_.received(k); }
  void finish() { receive_.finish(); }

 private:
  staged_receive<Engine> receive_;
};

/// One copy engine (so one staging buffer) per ps connection, and the pipelines of the request
/// in flight on each.
template <staging_copy_engine Engine>
class connection_staging {
 public:
  connection_staging(std::size_t connections, std::size_t segment_bytes)
      : segment_bytes_(segment_bytes), payloads_(connections), replies_(connections) {
    check_segment_bytes(segment_bytes, "ps staging");
    for (std::size_t i = 0; i < connections; ++i) engines_.push_back(std::make_unique<Engine>());
  }

  std::size_t segment_bytes() const noexcept { return segment_bytes_; }
  Engine& engine(std::size_t ps) { return *engines_.at(ps); }

  /// Orders every engine's copies against stream s (an engine that can: cuda_copy_engine's
  /// set_stream, docs/design/gpu-execution.md, section 6.2).
  template <class Stream>
    requires requires(Engine& e, Stream s) { e.set_stream(s); }
  void set_stream(Stream s) {
    for (auto& e : engines_) e->set_stream(s);
  }

  /// Sets c's payload to the ranges of `device`, staged through ps's buffer.
  void attach_payload(rpc_call& c, std::size_t ps, const std::byte* device, std::span<const staged_range> ranges) {
    payloads_.at(ps).reset();
    if constexpr (requires(Engine& e) { e.before_send(); }) engines_.at(ps)->before_send();
    c.payload_source = &payloads_[ps].emplace(*engines_[ps], device, ranges, segment_bytes_);
  }
  /// Sets c's reply to land in the ranges of `device`, staged through ps's buffer.
  void attach_reply(rpc_call& c, std::size_t ps, std::byte* device, std::span<const staged_range> ranges) {
    replies_.at(ps).reset();
    c.reply_sink = &replies_[ps].emplace(*engines_[ps], device, ranges, segment_bytes_);
  }
  /// Waits for the copies of ps's reply to device memory.
  void finish_reply(std::size_t ps) {
    if (replies_.at(ps)) replies_[ps]->finish();
  }

 private:
  std::size_t segment_bytes_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::optional<staged_payload<Engine>>> payloads_;
  std::vector<std::optional<staged_reply<Engine>>> replies_;
};

}  // namespace dtf::detail
