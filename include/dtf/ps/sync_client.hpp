// dtf/ps/sync_client.hpp — ps_client's part in the synchronous protocol over several ps (the
// protocol: dtf/ps/sync_protocol.hpp), a base of ps_client (dtf/ps/client.hpp): a contribution
// (staged, committed, its decision forwarded) and its id, the forwarding of ps 0's decisions to
// the other ps, and the hold of the steps a synchronous checkpoint takes
// (dtf/ps/checkpointing.hpp). A contribution's part for one ps larger than one request is sent
// in segments of whole shards (docs/design/large-models.md), each staged before the commit.
//
// Thread safety: as the ps_client's (one thread).
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/transport.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace dtf {

/// Rows of one embedding table contributed to a synchronous step with the dense gradient
/// (ps_client::push_sync; dtf/ps/sparse_client.hpp's lookup gives the layout): ps p's ids are
/// ids[ps_begin[p], ps_begin[p + 1]), each with dim floats of rows (read only by the push; a
/// strategy may scale them before, as it scales the dense gradient).
struct sync_rows {
  /// The table's handle and its floats per row.
  ///@{
  std::uint32_t table = 0, dim = 0;
  ///@}
  /// The ids contributed, grouped by ps.
  std::span<const std::uint64_t> ids;
  /// num_ps + 1 offsets into ids: ps p's are ids[ps_begin[p], ps_begin[p + 1]).
  std::span<const std::size_t> ps_begin;
  /// The ids' rows' gradients, dim floats each.
  std::span<float> rows;
};

}  // namespace dtf

namespace dtf::ps_detail {

/// Client: ps_client, which gives this base its calls (make_call, run).
template <class Client>
class sync_client {
 public:
  /// Synchronous training: stops ps 0 deciding steps (for at most the transport's timeout_ms)
  /// and brings every ps to ps 0's step, which it returns: what every ps then saves is that
  /// step's state. nullopt (nothing held) in asynchronous training. Errors: errc::timeout when
  /// a ps does not reach the step in time (the hold is released).
  std::optional<std::int64_t> hold_steps() {
    const auto timeout = self().transport().timeout_ms;
    std::vector<rpc_call> hold{self().make_call(0, detail::message_kind::ps_sync_hold,
                                                detail::encode_message(detail::ps_sync_hold_msg{true, timeout}))};
    self().run(hold);
    const auto st = detail::decode_message<detail::ps_status_msg>(hold[0].reply_meta, "status");
    if (!st.synchronous) return std::nullopt;
    try {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
      for (std::size_t ps = 1; ps < self().layout().num_ps; ++ps)
        for (;;) {
          std::vector<rpc_call> c{self().make_call(ps, detail::message_kind::ps_step,
                                                   detail::encode_message(detail::empty_msg{}))};
          self().run(c);
          const auto at = detail::decode_message<detail::ps_status_msg>(c[0].reply_meta, "status").global_step;
          if (at == st.global_step) break;
          if (at > st.global_step || std::chrono::steady_clock::now() > deadline)
            throw error(errc::timeout, "ps." + std::to_string(ps) + " is at step " + std::to_string(at) +
                                           ", not at ps.0's held step " + std::to_string(st.global_step));
          forward_decision(ps, at);  // its committers have not forwarded it yet
        }
    } catch (...) {
      release_steps();
      throw;
    }
    return st.global_step;
  }
  /// Ends hold_steps()'s hold.
  void release_steps() {
    std::vector<rpc_call> c{self().make_call(0, detail::message_kind::ps_sync_hold,
                                             detail::encode_message(detail::ps_sync_hold_msg{false, 0}))};
    self().run(c);
  }

 protected:
  /// A synchronous contribution (ps_client::push_sync, and its device forms).
  template <class Attach>
  sync_result contribute(std::size_t n, Attach attach, std::int64_t step, std::optional<float> learning_rate,
                        bool delta, std::span<const sync_rows> rows = {},
                        const data::position* position = nullptr, bool all_finite = true) {
    self().check_size(n, "push_sync");
    for (const auto& r : rows)
      if (r.ps_begin.size() != self().layout().num_ps + 1 || r.ps_begin.back() != r.ids.size() ||
          r.rows.size() != r.ids.size() * r.dim)
        throw error(errc::shape_mismatch, "push_sync: rows of table " + std::to_string(r.table) + " (" +
                                              std::to_string(r.ids.size()) + " ids, " + std::to_string(r.rows.size()) +
                                              " floats of dim " + std::to_string(r.dim) + ") laid out for another ps count");
    // Each ps's part in segments of whole shards (dtf/ps/request_parts.hpp), the rows with the
    // last, or alone after it when they would take the last over the bound.
    // (The client's cut, made once: segments point into it, copying no ids per step.)
    static const std::vector<std::uint32_t> rows_alone;
    std::vector<std::vector<const std::vector<std::uint32_t>*>> segments(self().layout().num_ps);
    for (const auto& [ps, ids] : self().parts_for("push_sync")) segments[ps].push_back(&ids);
    const auto& t = self().transport();
    const std::uint64_t bound = std::min<std::uint64_t>(t.max_request_bytes, t.limits.max_payload_bytes);
    auto bytes_of = [&](const std::vector<std::uint32_t>& ids) {
      std::uint64_t b = 0;
      for (auto id : ids) b += self().layout().shards[id].size * sizeof(float);
      return b;
    };
    for (std::size_t ps = 0; ps < segments.size(); ++ps) {
      std::uint64_t row_bytes = 0;
      for (const auto& r : rows) row_bytes += (r.ps_begin[ps + 1] - r.ps_begin[ps]) * (sizeof(std::uint64_t) + r.dim * sizeof(float));
      if (row_bytes > t.limits.max_payload_bytes)
        throw error(errc::invalid_argument, "push_sync: the embedding rows for ps." + std::to_string(ps) + " are " +
                                                std::to_string(row_bytes) + " bytes, over the " +
                                                std::to_string(t.limits.max_payload_bytes) + " one frame may carry");
      if (row_bytes > 0 && !segments[ps].back()->empty() && bytes_of(*segments[ps].back()) + row_bytes > bound)
        segments[ps].push_back(&rows_alone);
    }
    std::vector<detail::sync_receipt> receipts;  // ps 1 ..'s, for the commit
    auto call_to = [&](std::size_t ps, std::size_t k, detail::message_kind kind) {
      const auto& ids = *segments[ps][k];
      const bool last = k + 1 == segments[ps].size();
      detail::ps_sync_push_msg m{ids, step, delta ? detail::update_kind::delta : detail::update_kind::gradient,
                                 learning_rate};
      m.incarnation = incarnation();
      m.sequence = sequence();
      m.segment = std::uint32_t(k);
      m.segments = std::uint32_t(segments[ps].size());
      for (const auto& r : rows)
        if (const std::size_t b = r.ps_begin[ps], e = r.ps_begin[ps + 1]; last && e > b) m.rows.push_back({r.table, e - b});
      if (ps == 0 && position) m.position = *position;
      if (ps == 0) m.all_finite = all_finite;
      if (kind == detail::message_kind::ps_sync_push) m.receipts = receipts;
      return self().make_call(ps, kind, detail::encode_message(m));
    };
    // The payload, attached just before the request goes (a device form's staging buffer is one
    // per ps): the segment's shards, then the rows.
    auto attach_to = [&](rpc_call& c, std::size_t ps, std::size_t k) {
      const auto& ids = *segments[ps][k];
      if (!ids.empty() || segments[ps].size() == 1) attach(c, ps, ids);  // not a segment of rows alone
      for (const auto& r : rows)
        if (const std::size_t b = r.ps_begin[ps], e = r.ps_begin[ps + 1]; k + 1 == segments[ps].size() && e > b) {
          c.payload.push_back(asio::buffer(r.ids.data() + b, (e - b) * sizeof(std::uint64_t)));
          c.payload.push_back(asio::buffer(r.rows.data() + b * r.dim, (e - b) * r.dim * sizeof(float)));
        }
    };
    // The protocol of dtf/ps/sync_protocol.hpp: the parts are staged on ps 1.. (and the
    // segments of ps 0's before its last on ps 0), each ps p > 0 answering its part's last
    // segment with a receipt; then the commit goes to ps 0 with its last segment and the
    // receipts; ps 0 decides the step and answers with its (signed) decision; the decision is
    // forwarded to ps 1.. (each applies it once). Every request may be retried.
    std::vector<rpc_call> stages;
    std::vector<std::size_t> segment_of;
    for (std::size_t ps = 0; ps < segments.size(); ++ps)
      for (std::size_t k = 0; k + (ps == 0) < segments[ps].size(); ++k) {
        stages.push_back(call_to(ps, k, detail::message_kind::ps_sync_stage));
        segment_of.push_back(k);
      }
    self().run(stages, [&](std::size_t i, rpc_call& c) { attach_to(c, c.peer, segment_of[i]); }, [](const rpc_call&) {});
    for (const auto& c : stages)  // a stage answered dropped (a finished step) has none: ps 0 drops the commit
      if (auto st = detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status"); st.receipt)
        receipts.push_back(std::move(*st.receipt));
    std::vector<rpc_call> first{call_to(0, segments[0].size() - 1, detail::message_kind::ps_sync_push)};
    attach_to(first[0], 0, segments[0].size() - 1);
    self().run(first);
    self().track_done(first);
    const auto st0 = detail::decode_message<detail::ps_status_msg>(first[0].reply_meta, "status");
    sync_result r{st0.global_step, st0.dropped, st0.skipped, st0.dropped_total};
    if (st0.decision) forward(*st0.decision, self().layout().num_ps);
    answered();
    return r;
  }

  /// With the task's identity, the id of a contribution: the incarnation is drawn per client, so
  /// a restarted task's contributions are never taken for its earlier life's; the sequence
  /// counts the answered contributions, so a retry of one that got no answer (a timeout, a lost
  /// connection: ps_recovery runs the step again) has its id, and counts once.
  std::uint64_t incarnation() const noexcept { return incarnation_; }
  std::uint64_t sequence() const noexcept { return sequence_; }  ///< see incarnation()
  void answered() noexcept { ++sequence_; }                      ///< a contribution was answered

  /// Sends decision d to ps 1 .. num_ps - 1; each has applied it (now or before) on return.
  void forward(const detail::sync_decision& d, std::size_t num_ps) {
    std::vector<rpc_call> calls;
    for (std::size_t ps = 1; ps < num_ps; ++ps)
      calls.push_back(self().make_call(ps, detail::message_kind::ps_sync_apply,
                                       detail::encode_message(detail::ps_sync_apply_msg{d})));
    self().run(calls);
  }

  /// Asks ps 0 for the decision of `step` and forwards it to ps `ps`, when ps 0 still keeps it
  /// (a pull found ps `ps` behind: the step's committers died before forwarding it).
  void forward_decision(std::size_t ps, std::int64_t step) {
    std::vector<rpc_call> ask{self().make_call(0, detail::message_kind::ps_sync_decision,
                                               detail::encode_message(detail::ps_sync_apply_msg{{step, {}}}))};
    self().run(ask);
    const auto st = detail::decode_message<detail::ps_status_msg>(ask[0].reply_meta, "status");
    if (!st.decision) return;
    std::vector<rpc_call> one{self().make_call(ps, detail::message_kind::ps_sync_apply,
                                               detail::encode_message(detail::ps_sync_apply_msg{*st.decision}))};
    self().run(one);
  }

 private:
  Client& self() { return static_cast<Client&>(*this); }
  std::uint64_t incarnation_ = (std::uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  std::uint64_t sequence_ = 0;
};

}  // namespace dtf::ps_detail
