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
// One request to ps 0 each (a few dozen bytes). Errors: those of the transport
// (errc::peer_failure / timeout: retried under ps_recovery like any ps call); a reply that does
// not decode is errc::corrupt_data.
// Thread safety: like the ps_client (one thread).
#pragma once

#include <dtf/data/position.hpp>
#include <dtf/detail/archive.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/ps/client.hpp>

#include <optional>
#include <string>
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

}  // namespace dtf
