// dtf/ps/positions.hpp — the training tasks' data positions (dtf/data/position.hpp), kept on
// ps 0 so that a restarted task resumes its shard where it was instead of at the start:
//
//   every task      report_position(ps, at) after each step: ps 0 replaces that task's entry
//   the chief       save_checkpoint asks ps 0 for every entry and writes them into the manifest;
//                   a restore sends them back (fill_only: only tasks ps 0 holds none for, i.e.
//                   after a ps restart; a live ps keeps the newer reports it has)
//   a (re)started   recorded_position(ps) after the session is created (ps 0 ready): its own
//   task            entry, if any; it checks it with position::unusable_in and resumes there
//
// ps 0 keeps the chief's model buffers (dtf::has_buffers) the same way: publish_buffers (the
// chief, after it initialised or restored the job), published_buffers (a worker, at its start),
// so that every task starts from the chief's (frozen parameters, running statistics).
//
// One request to ps 0 each (a few dozen bytes; the buffers' floats besides). Errors: those of the transport
// (errc::peer_failure / timeout: retried under ps_recovery like any ps call); a reply that does
// not decode is errc::corrupt_data.
// Thread safety: like the ps_client (one thread).
#pragma once

#include <dtf/data/position.hpp>
#include <dtf/detail/archive.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/ps/client.hpp>

#include <asio/buffer.hpp>

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace dtf {

namespace detail {
inline ps_positions_msg call_positions(ps_client& client, const ps_positions_msg& m) {
  std::vector<rpc_call> calls{client.request(0, message_kind::ps_positions, encode_message(m))};
  client.call_all(calls);
  return decode_message<ps_positions_msg>(calls[0].reply_meta, "positions reply");
}
}  // namespace detail

/// Records this task's position (under its identity) on ps 0.
inline void report_position(ps_client& client, const data::position& at) {
  detail::ps_positions_msg m;
  m.positions.push_back({client.identity(), at});
  (void)detail::call_positions(client, m);
}

/// This task's position as ps 0 holds it (nullopt: none recorded, e.g. a first start).
inline std::optional<data::position> recorded_position(ps_client& client) {
  detail::ps_positions_msg m;
  m.tasks.push_back(client.identity());
  const auto r = detail::call_positions(client, m);
  for (const auto& p : r.positions)
    if (p.task == client.identity()) return p.at;
  return std::nullopt;
}

/// Every task's position held by ps 0, ordered by task name.
inline std::vector<data::task_position> recorded_positions(ps_client& client) {
  detail::ps_positions_msg m;
  m.all = true;
  return detail::call_positions(client, m).positions;
}

/// Gives ps 0 the positions of a checkpoint: each one a task ps 0 holds none for (a ps that
/// restarted lost them; a live one keeps the newer reports it has).
inline void restore_positions(ps_client& client, const std::vector<data::task_position>& positions) {
  if (positions.empty()) return;
  detail::ps_positions_msg m;
  m.positions = positions;
  m.fill_only = true;
  (void)detail::call_positions(client, m);
}

/// The chief: its model's buffers onto ps 0, replacing any it holds.
inline void publish_buffers(ps_client& client, std::span<const float> values) {
  detail::ps_buffers_msg m{.op = detail::ps_buffers_msg::publish, .floats = values.size()};
  std::vector<rpc_call> calls{client.request(0, detail::message_kind::ps_buffers, detail::encode_message(m))};
  calls[0].payload.push_back(asio::buffer(values.data(), values.size_bytes()));
  client.call_all(calls);
}

/// The chief's buffers from ps 0 into `out`, waiting up to `timeout` for the chief to publish
/// them (it does after it initialised or restored the ps). Returns false when none came.
/// Errors: errc::shape_mismatch when ps 0 holds another number of floats (another model).
inline bool published_buffers(ps_client& client, std::span<float> out, std::chrono::milliseconds timeout,
                              std::chrono::milliseconds poll = std::chrono::milliseconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<rpc_call> calls{client.request(0, detail::message_kind::ps_buffers, detail::encode_message(
                                                                                        detail::ps_buffers_msg{}))};
    client.call_all(calls);
    const auto held = detail::decode_message<detail::ps_buffers_msg>(calls[0].reply_meta, "buffers reply");
    if (held.held) {
      if (held.floats != out.size())
        throw error(errc::shape_mismatch, "the chief's buffers on ps 0 are " + std::to_string(held.floats) +
                                              " floats, this task's model has " + std::to_string(out.size()));
      detail::ps_buffers_msg m{.op = detail::ps_buffers_msg::fetch, .floats = out.size()};
      calls = {client.request(0, detail::message_kind::ps_buffers, detail::encode_message(m))};
      calls[0].reply_payload.push_back(asio::buffer(out.data(), out.size_bytes()));
      client.call_all(calls);
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(poll);  // the chief's publish is another process's step: polled, bounded
  }
}

}  // namespace dtf
