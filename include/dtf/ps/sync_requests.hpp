// dtf/ps/sync_requests.hpp — the parameter server's synchronous requests over its state (the
// protocol: dtf/ps/sync_protocol.hpp; the sums: dtf/ps/sync_aggregator.hpp):
//   sync push      ps 0: a commit with ps 0's part; answered with the step's decision
//   sync stage     ps p > 0: a part, staged and acknowledged at once (with a receipt once whole)
//   sync apply     ps p > 0: a decision to apply (a second one is answered at once; one ps 0
//                  did not sign is an error to its sender)
//   sync decision  ps 0: the decision of a finished step (none once it is no longer kept)
//   sync hold      ps 0, from the chief: stop deciding steps (a checkpoint), or resume; a hold
//                  ends with its connection, or at the first commit after its timeout
// A step's apply, from its first shard to the new step number, holds the step lock exclusively
// (a pull sees every shard of one step and that step's number).
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/done_tasks.hpp>
#include <dtf/ps/position_table.hpp>
#include <dtf/ps/shard_store.hpp>
#include <dtf/ps/sparse_service.hpp>
#include <dtf/ps/sync_aggregator.hpp>
#include <dtf/transport.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>

namespace dtf::ps_detail {

class sync_requests {
 public:
  /// How the server answers: status(reply, dropped, dropped_total, skipped, decision).
  using status_fn =
      std::function<void(rpc_reply&, bool, std::uint64_t, bool, const std::optional<detail::sync_decision>&)>;

  sync_requests(const ps_options& options, shard_store& store, sparse_service& sparse, position_table& positions,
                sync_aggregator& sync, std::shared_mutex& step_mu, std::atomic<std::int64_t>& global_step,
                std::atomic<std::uint64_t>& updates, status_fn status)
      : options_(options), store_(store), sparse_(sparse), positions_(positions), sync_(sync), step_mu_(step_mu),
        global_step_(global_step), updates_(updates), status_(std::move(status)) {}

  /// One synchronous request; the caller holds the server's lock on the model (shared).
  void handle(const rpc_peer& peer, detail::message_kind kind, std::span<const std::byte> meta,
              std::span<std::byte> payload, rpc_reply& reply) {
    using detail::message_kind;
    if (kind == message_kind::ps_sync_hold) {
      const auto m = detail::decode_message<detail::ps_sync_hold_msg>(meta, "synchronous hold");
      if (m.hold)
        sync_.hold(peer.remote, std::chrono::steady_clock::now() + std::chrono::milliseconds(m.timeout_ms));
      else
        stepping([&](auto& apply, auto& advanced, auto& answer) {
          sync_.release(peer.remote, sparse_, apply, advanced, answer);
        });
      return status_(reply, false, 0, false, std::nullopt);
    }
    if (kind == message_kind::ps_sync_apply || kind == message_kind::ps_sync_decision) {
      const auto m = detail::decode_message<detail::ps_sync_apply_msg>(meta, "synchronous decision");
      if (kind == message_kind::ps_sync_decision) return status_(reply, false, 0, false, sync_.decision_of(m.decision.step));
      stepping([&](auto& apply, auto& advanced, auto&) { sync_.apply_decision(m.decision, sparse_, apply, advanced); });
      return status_(reply, false, 0, false, std::nullopt);
    }
    const auto m = detail::decode_message<detail::ps_sync_push_msg>(meta, "sync push");
    // The dense shards' floats, then the rows of embedding tables (sparse_service::sync_rows).
    const std::size_t dense = std::min(payload.size(), store_.bytes_of(m.ids));
    const auto rows = sparse_.sync_rows(peer, m.rows, payload.subspan(dense));
    if (m.position) positions_.admit(peer.identity);  // recorded with the step (position_table)
    if (const auto [known, held] = sync_.named(peer.identity); !known)  // the tables' names are bounded
      admit_task_name(options_, peer.identity, held, "synchronous push");
    sync_.seen(peer.remote, peer.identity);
    if (kind == message_kind::ps_sync_stage) {
      const auto r = sync_.stage(peer.identity, m, payload.first(dense), rows.parts, store_, sparse_, options_.nonfinite);
      status_(reply, r.dropped, 0, false, std::nullopt);
      if (r.receipt) {  // the ps's status, with the receipt the worker carries to ps 0
        auto st = detail::decode_message<detail::ps_status_msg>(reply.meta, "status");
        st.receipt = r.receipt;
        reply.meta = detail::encode_message(st);
      }
      return;
    }
    std::optional<sync_aggregator::outcome> r;
    stepping([&](auto& apply, auto& advanced, auto& answer) {
      r = sync_.contribute(peer.identity, m, payload.first(dense), rows.parts, store_, sparse_, options_.nonfinite,
                           [&] { return peer.defer(); }, apply, advanced, answer);
    });
    if (!r) {
      reply.deferred = true;
      return;
    }
    if (r->dropped)  // a count per interval, not a line each: a backup worker's are many
      stale_log_.counted([&](std::size_t unlogged) {
        detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": dropped " +
                                                 std::to_string(unlogged + 1) + " stale contribution(s) since the "
                                                 "last such line, the latest of " + peer.identity + " for step " +
                                                 std::to_string(m.step) + " (" + std::to_string(r->dropped_total) +
                                                 " dropped from it so far)");
      });
    if (r->skipped)
      detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": skipped a non-finite contribution of " +
                                               peer.identity);
    status_(reply, r->dropped, r->dropped_total, r->skipped, r->decision);
  }

  /// A connection ended: a hold it had ends (under `model_mu`, the server's lock on the model).
  void disconnected(const rpc_peer& peer, std::shared_mutex& model_mu) {
    std::shared_lock lock(model_mu);
    stepping([&](auto& apply, auto& advanced, auto& answer) { sync_.release(peer.remote, sparse_, apply, advanced, answer); });
  }

 private:
  // f(apply, advanced, answer): the aggregator's callbacks for a step's apply.
  template <class F>
  void stepping(F&& f) {
    std::unique_lock step_lock(step_mu_, std::defer_lock);
    auto apply = [&](std::uint32_t id, const update& u) {
      if (!step_lock.owns_lock()) step_lock.lock();
      store_.apply(store_.find(id), u);
    };
    auto advanced = [&](std::int64_t step, const std::map<std::string, data::position>& positions) {
      if (!step_lock.owns_lock()) step_lock.lock();
      positions_.record(positions);  // before anyone is released: a checkpoint of step holds them
      global_step_ = step;
      ++updates_;
      step_lock.unlock();
    };
    auto answer = [&](rpc_reply& out, const detail::sync_decision& d, bool dropped, std::uint64_t total) {
      status_(out, dropped, total, false, d);
    };
    f(apply, advanced, answer);
  }

  const ps_options& options_;
  shard_store& store_;
  sparse_service& sparse_;
  position_table& positions_;
  sync_aggregator& sync_;
  std::shared_mutex& step_mu_;
  std::atomic<std::int64_t>& global_step_;
  std::atomic<std::uint64_t>& updates_;
  status_fn status_;
  detail::log_limiter stale_log_{std::chrono::milliseconds(options_.transport.refusal_log_interval_ms)};
};

}  // namespace dtf::ps_detail
