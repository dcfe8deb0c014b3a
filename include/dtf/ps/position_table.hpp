// dtf/ps/position_table.hpp — the ps's part of data positions (dtf/ps/positions.hpp): one
// data::position per training task, as the tasks last reported them (ps 0 holds them; any ps
// answers). Kept in memory: a restarted ps starts empty and the chief's restore refills it from
// the checkpoint (fill_only: a task that reported since keeps its newer position).
//
// What a peer cannot do: record a position in another task's name, except the chief
// (ps_options::chief; anyone when it is not set) as a restore (fill_only) of tasks this ps has
// none for; grow the table beyond the known workers
// (ps_options::known_workers) or, without that list, max_done_tasks entries of names of at most
// 256 characters. A request is checked whole before anything is recorded.
//
// It keeps the chief's model buffers too (ps_buffers, dtf/ps/positions.hpp): the chief's
// publish replaces them (another task's is refused before its payload is read); any task
// queries their size and fetches them. In memory, like the positions: the chief publishes them
// again after it re-initialises a ps that restarted.
//
// Thread safety: its own mutex (requests arrive on every I/O thread).
#pragma once

#include <dtf/data/position.hpp>
#include <dtf/detail/archive.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/error.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/done_tasks.hpp>  // admit_task_name
#include <dtf/transport.hpp>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace dtf::ps_detail {

class position_table {
 public:
  explicit position_table(const ps_options& options) : options_(options) {}

  /// Handles a ps_positions request: records, then answers with the positions asked for.
  void handle(const rpc_peer& peer, std::span<const std::byte> meta, rpc_reply& reply) {
    const auto m = detail::decode_message<detail::ps_positions_msg>(meta, "positions");
    std::lock_guard g(mu_);
    for (const auto& p : m.positions) check(peer, m, p.task);
    for (const auto& p : m.positions) {
      if (m.fill_only && positions_.count(p.task)) continue;
      positions_[p.task] = p.at;
    }
    detail::ps_positions_msg out;
    if (m.all) {
      for (const auto& [task, at] : positions_) out.positions.push_back({task, at});
    } else {
      for (const auto& t : m.tasks)
        if (const auto it = positions_.find(t); it != positions_.end()) out.positions.push_back({t, it->second});
    }
    reply.meta = detail::encode_message(out);
  }

  /// Whether `task` (an authenticated sender's own name) may hold a position here: checked
  /// before a synchronous contribution carrying one is recorded. Errors: as a report's.
  void admit(const std::string& task) const {
    std::lock_guard g(mu_);
    admit_task_name(options_, task, positions_.size() - positions_.count(task), "positions");
  }
  /// Records the positions a completed synchronous step's contributions carried (each
  /// admitted when its contribution was recorded; one that no longer fits is left out).
  void record(const std::map<std::string, data::position>& positions) {
    std::lock_guard g(mu_);
    for (const auto& [task, at] : positions) try {
        admit_task_name(options_, task, positions_.size() - positions_.count(task), "positions");
        positions_[task] = at;
      } catch (const error&) {
      }
  }

  /// The most bytes a ps_buffers request may carry: a publish from the chief, its floats.
  /// Errors: errc::invalid_argument for a publish from another task or announcing another size.
  std::uint64_t buffers_limit(const rpc_peer& peer, std::span<const std::byte> meta, std::uint64_t payload) const {
    const auto m = detail::decode_message<detail::ps_buffers_msg>(meta, "buffers");
    if (m.op != detail::ps_buffers_msg::publish) return 0;
    if (!options_.chief.empty() && peer.identity != options_.chief)
      throw error(errc::invalid_argument, "buffers from " + peer.identity + " refused: only the chief (" +
                                              options_.chief + ") publishes them");
    if (payload != m.floats * sizeof(float))
      throw error(errc::invalid_argument, "buffers: " + std::to_string(payload) + " bytes for " +
                                              std::to_string(m.floats) + " floats");
    return payload;
  }
  /// Handles a ps_buffers request (checked by buffers_limit before its payload was read).
  void buffers(std::span<const std::byte> meta, std::span<const std::byte> payload, rpc_reply& reply) {
    const auto m = detail::decode_message<detail::ps_buffers_msg>(meta, "buffers");
    std::lock_guard g(mu_);
    if (m.op == detail::ps_buffers_msg::publish) {
      auto values = std::make_shared<std::vector<float>>(m.floats);
      std::memcpy(values->data(), payload.data(), payload.size());
      buffers_ = std::move(values);
    }
    detail::ps_buffers_msg out{.held = buffers_ != nullptr, .floats = buffers_ ? buffers_->size() : 0};
    if (m.op == detail::ps_buffers_msg::fetch) {
      if (!buffers_ || buffers_->size() != m.floats)
        throw error(errc::invalid_argument, "buffers: " + std::to_string(m.floats) + " floats asked for, " +
                                                std::to_string(out.floats) + " held");
      reply.holds.push_back(buffers_);  // a publish meanwhile replaces them, this reply keeps its own
      reply.payload.push_back(asio::buffer(buffers_->data(), buffers_->size() * sizeof(float)));
    }
    reply.meta = detail::encode_message(out);
  }

  /// Every position held (for tests and logs).
  std::map<std::string, data::position> snapshot() const {
    std::lock_guard g(mu_);
    return positions_;
  }

 private:
  // Caller holds mu_.
  void check(const rpc_peer& peer, const detail::ps_positions_msg& m, const std::string& task) const {
    const bool restore = m.fill_only && (options_.chief.empty() || peer.identity == options_.chief);
    if (!restore && task != peer.identity)
      throw error(errc::invalid_argument, "positions: " + peer.identity + " may report its own position only, not '" +
                                              task.substr(0, 64) + "'s" +
                                              (m.fill_only ? " (only the chief restores others')" : ""));
    // A name already held does not grow the table.
    admit_task_name(options_, task, positions_.size() - positions_.count(task), "positions");
  }

  const ps_options& options_;
  mutable std::mutex mu_;
  std::map<std::string, data::position> positions_;
  std::shared_ptr<const std::vector<float>> buffers_;  // the chief's model buffers, once published
};

}  // namespace dtf::ps_detail
