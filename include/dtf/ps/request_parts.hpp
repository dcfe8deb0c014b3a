// dtf/ps/request_parts.hpp — a ps's share of a model transfer (init, pull, push, restore, a
// synchronous contribution; from host or device memory) cut into requests of bounded size, and
// requests run so that each ps gets its own in order.
//
// The contract: docs/design/large-models.md. A part is consecutive whole shards of the ps (in
// placement order) carrying at most transport_options::max_request_bytes of payload (and no more
// than the frame limit, transport_options::limits, where that is lower) and at most
// max_shards_per_request shards (its metadata stays far under the frame's 64 KiB); a shard
// larger than the bound is a part of its own, and one larger than a frame may carry is refused
// here, before anything is sent. A ps's parts are sent one after another (the next once the
// previous is answered); different ps's in parallel.
#pragma once

#include <dtf/error.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/transport.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::ps_detail {

/// The most shards one request names.
inline constexpr std::size_t max_shards_per_request = 1024;

/// `ids` (shards of ps `ps` in `layout`) cut into parts; `per`: floats sent per element (1 for
/// values, 1 + slots for a restore through the chief, 0 for a request without payload: cut by
/// count only). Never empty: no ids give one empty part. `what` names the request in errors.
/// Errors: invalid_argument for a shard that no frame can carry.
inline std::vector<std::vector<std::uint32_t>> request_parts(const std::vector<std::uint32_t>& ids,
                                                             const placement& layout, std::uint64_t per,
                                                             const transport_options& options, const char* what,
                                                             std::size_t ps) {
  std::vector<std::vector<std::uint32_t>> parts(1);
  const std::uint64_t bound = std::min<std::uint64_t>(options.max_request_bytes, options.limits.max_payload_bytes);
  std::uint64_t bytes = 0;
  for (const auto id : ids) {
    const std::uint64_t b = std::uint64_t(layout.shards.at(id).size) * per * sizeof(float);
    if (b > options.limits.max_payload_bytes)
      throw error(errc::invalid_argument,
                  std::string(what) + ": shard " + std::to_string(id) + " of ps." + std::to_string(ps) + " is " +
                      std::to_string(b) + " bytes" + (per > 1 ? " with its slots" : "") + ", over the " +
                      std::to_string(options.limits.max_payload_bytes) +
                      " one frame may carry: partition the variable into smaller shards "
                      "(variable_axis_size's max_shard_bytes)");
    if (!parts.back().empty() &&
        (b > bound - std::min(bytes, bound) ||
         parts.back().size() == max_shards_per_request)) {
      parts.emplace_back();
      bytes = 0;
    }
    parts.back().push_back(id);
    bytes += b;
  }
  return parts;
}

/// Runs `calls` with run(std::vector<rpc_call>&) in rounds of at most one call per ps: the
/// calls to one ps in their order, each round once the previous one is answered.
/// before(i, call) is called for call i just before its round (a device form's staging buffer,
/// one per ps, takes the part then), after(call) once its round is answered. The replies are
/// left in `calls`.
template <class Run, class Before, class After>
void run_in_rounds(std::vector<rpc_call>& calls, Run&& run, Before&& before, After&& after) {
  std::vector<bool> done(calls.size());
  for (;;) {
    std::set<std::size_t> peers;
    std::vector<std::size_t> round;
    for (std::size_t i = 0; i < calls.size(); ++i)
      if (!done[i] && peers.insert(calls[i].peer).second) round.push_back(i);
    if (round.empty()) return;
    if (round.size() == calls.size()) {  // one call per ps: the usual case
      for (std::size_t i = 0; i < calls.size(); ++i) before(i, calls[i]);
      run(calls);
      for (auto& c : calls) after(c);
      return;
    }
    std::vector<rpc_call> batch;
    for (const auto i : round) {
      before(i, calls[i]);
      batch.push_back(std::move(calls[i]));
    }
    run(batch);
    for (std::size_t j = 0; j < round.size(); ++j) {
      after(batch[j]);
      calls[round[j]] = std::move(batch[j]);
      done[round[j]] = true;
    }
  }
}
template <class Run>
void run_in_rounds(std::vector<rpc_call>& calls, Run&& run) {
  run_in_rounds(calls, run, [](std::size_t, rpc_call&) {}, [](rpc_call&) {});
}

}  // namespace dtf::ps_detail
