// dtf/ps/client.hpp — a task's view of the parameter servers: the data plane (pull, push,
// push_sync, each returning one decoded result) and control (init, ready, shutdown; the end of
// a job, done, is dtf/ps/done_client.hpp).
// Checkpointing is dtf/ps/checkpointing.hpp (free functions over a ps_client).
//
// Communication volume: a pull moves every requested shard's bytes once, server to worker;
// a push moves them once the other way. The worker's bytes go from its buffer to the socket
// and from the socket into its buffer (scatter/gather, no copy on the worker). A ps's share of
// an init, pull, push or synchronous contribution goes in requests of at most
// transport_options::max_request_bytes (dtf/ps/request_parts.hpp), from host memory or from
// device memory (the device_span forms: dtf/ps/device_forms.hpp).
//
// Thread safety: a ps_client serves one thread.
#pragma once

#include <dtf/detail/archive.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/device_forms.hpp>
#include <dtf/ps/done_client.hpp>
#include <dtf/ps/request_parts.hpp>
#include <dtf/ps/sync_client.hpp>
#include <dtf/transport.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace dtf {


/// A worker's (or the chief's) view of the parameter servers.
///
/// Buffers passed to pull/push are the model's flat float32 parameter or gradient buffers in
/// host memory (std::span) or device memory (dtf::device_span, a device tensor's elements);
/// shards are read from and written to their place in them directly (device memory on CUDA
/// builds: through the connection's pinned staging buffer, see the file comment).
class ps_client : public ps_detail::device_forms<ps_client>,
                  public ps_detail::done_client<ps_client>,
                  public ps_detail::sync_client<ps_client> {
  friend class ps_detail::device_forms<ps_client>;  // its forms use read, push and sync_push
  friend class ps_detail::done_client<ps_client>;   // it uses make_call, broadcast and run
  friend class ps_detail::sync_client<ps_client>;   // it uses make_call, run and the layout

 public:
  using device_forms::pull;
  using device_forms::push_deltas;
  using device_forms::push_gradients;
  using device_forms::push_sync;

  /// ps_addresses[i] is ps task i's "host:port"; placement says which shards each holds.
  ps_client(std::vector<std::string> ps_addresses, placement layout, transport_options options)
      : layout_(std::move(layout)), rpc_(std::move(options)) {
    if (ps_addresses.size() != layout_.num_ps)
      throw error(errc::invalid_config, "ps_client: " + std::to_string(ps_addresses.size()) +
                                            " ps addresses for a placement over " + std::to_string(layout_.num_ps) +
                                            " ps tasks");
    for (std::size_t i = 0; i < ps_addresses.size(); ++i) rpc_.add_peer("ps." + std::to_string(i), ps_addresses[i]);
    for (std::size_t i = 0; i < layout_.num_ps; ++i) ids_.push_back(to_ids(layout_.shards_on(i)));
    seen_.assign(layout_.num_ps, 0);
  }

  /// How the variables are placed on the ps (shards and their ps).
  const placement& layout() const noexcept { return layout_; }
  /// This task's identity ("worker.1"), as presented to the ps.
  const std::string& identity() const noexcept { return rpc_.options().identity; }

  /// Connects to every ps (retrying while they start). Errors: see rpc_client::connect_all.
  void connect() { rpc_.connect_all(); }

  /// Sends the initial values and the update rule to every ps (the chief does this once).
  /// With config.replicas_to_aggregate = N > 0 the ps runs synchronously (see push_sync).
  /// Errors: invalid_config (N above config.num_workers, lock-free with a stateful rule),
  /// invalid_argument (a ps already holds another model).
  void initialize(std::span<const float> params, const ps_config& config) {
    check_size(params.size(), "initialize");
    std::vector<rpc_call> calls;
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps) {
      const auto parts = ps_detail::request_parts(ids_[ps], layout_, 1, rpc_.options(), "initialize", ps);
      for (std::uint32_t k = 0; k < parts.size(); ++k) {
        detail::ps_init_msg m;
        m.ids = parts[k];
        for (auto id : m.ids) m.sizes.push_back(layout_.shards[id].size);
        set_config(m, config);
        m.num_ps = std::uint32_t(layout_.num_ps);  // the receipts a synchronous ps 0 requires
        m.ps_index = std::uint32_t(ps);
        m.part = k;
        m.parts = std::uint32_t(parts.size());
        calls.push_back(make_call(ps, detail::message_kind::ps_init, detail::encode_message(m)));
        gather(calls.back(), parts[k], params);
      }
    }
    run(calls);
  }

  /// True when every ps has been initialised.
  bool ready() {
    auto calls = broadcast(detail::message_kind::ps_ready);
    run(calls);
    for (auto& c : calls)
      if (!detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").initialized) return false;
    return true;
  }

  /// Waits (polling every poll_ms, bounded by timeout) until every ps is initialised.
  /// Errors: errc::timeout naming the wait.
  void wait_ready(std::chrono::milliseconds timeout, std::chrono::milliseconds poll = std::chrono::milliseconds(50)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!ready()) {
      if (std::chrono::steady_clock::now() + poll > deadline)
        throw error(errc::timeout, "parameter servers not initialised within " + std::to_string(timeout.count()) +
                                       " ms (is the chief running?)");
      // Polling interval of a readiness check, not a synchronisation stand-in: the ps has no
      // way to call the worker back.
      std::this_thread::sleep_for(poll);
    }
  }

  /// Reads every shard into params. Returns the global step. The update counts read with it
  /// are what the next push's staleness (DynSGD's τ) is counted from.
  std::int64_t pull(std::span<float> params) {
    return read(params.size(), true, host_reply{*this, params}, no_finish{});
  }

  /// Reads every shard into params without counting as this client's pull: an evaluation of
  /// the centre variable on a worker's client leaves that worker's τ alone.
  std::int64_t read_values(std::span<float> params) {
    return read(params.size(), false, host_reply{*this, params}, no_finish{});
  }


 private:
  struct no_finish {
    void operator()(std::size_t) const noexcept {}
  };
  // A request's payload from, or its reply into, the caller's host buffer (in place), a part
  // of a ps's shards at a time: attach(call, ps, ids), as the device forms' attach.
  struct host_payload {
    const ps_client& self;
    std::span<const float> buf;
    void operator()(rpc_call& c, std::size_t, const std::vector<std::uint32_t>& ids) const { self.gather(c, ids, buf); }
  };
  struct host_reply {
    const ps_client& self;
    std::span<float> buf;
    void operator()(rpc_call& c, std::size_t, const std::vector<std::uint32_t>& ids) const { self.scatter(c, ids, buf); }
  };

  // A request per part of each ps's shards (request_parts), as (ps, shard ids): the cut
  // depends only on the placement and the options, so it is made once.
  using part_list = std::vector<std::pair<std::size_t, std::vector<std::uint32_t>>>;
  const part_list& parts_for(const char* what) const {
    if (!parts_) {
      part_list out;
      for (std::size_t ps = 0; ps < layout_.num_ps; ++ps)
        for (auto& p : ps_detail::request_parts(ids_[ps], layout_, 1, rpc_.options(), what, ps)) out.emplace_back(ps, std::move(p));
      parts_ = std::move(out);
    }
    return *parts_;
  }

  // A pull of n floats: attach(call, ps, ids) says where each reply lands, just before its
  // request is sent (a device form's staging buffer is one per ps); finish(ps) waits for what
  // the reply started (the staged copies to device memory) before the next part is read.
  template <class Attach, class Finish>
  std::int64_t read(std::size_t n, bool track, Attach attach, Finish finish) {
    check_size(n, "pull");
    const auto& parts = parts_for("pull");
    auto read_parts = [&](const std::vector<std::size_t>& which) {
      std::vector<rpc_call> cs;
      for (const auto i : which)
        cs.push_back(make_call(parts[i].first, detail::message_kind::ps_pull, detail::encode_message(detail::ps_pull_msg{parts[i].second})));
      run(cs, [&](std::size_t j, rpc_call& c) { attach(c, parts[which[j]].first, parts[which[j]].second); },
          [&](const rpc_call& c) { finish(c.peer); });
      return cs;
    };
    std::vector<std::size_t> every(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) every[i] = i;
    auto calls = read_parts(every);
    // Synchronous training: a ps still completing the step the others finished (its admitted
    // contributions are on their way) is read again until it has, so the values returned are
    // all of one step, the tag's. ps 0 cannot start the next step before every ps finished
    // this one (contributions for it need a pull that saw every ps there), so this ends
    // within the admitted workers' round trips; bounded by timeout_ms.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(rpc_.options().timeout_ms);
    for (;;) {
      std::int64_t most = std::numeric_limits<std::int64_t>::min();
      bool sync = false;
      for (const auto& c : calls) {
        const auto st = detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status");
        sync = sync || st.synchronous;
        most = std::max(most, st.global_step);
      }
      std::vector<std::size_t> behind;  // the parts read at an earlier step
      std::map<std::size_t, std::int64_t> missed;  // ps p > 0 behind: its step (decided, not applied there)
      for (std::size_t i = 0; sync && i < calls.size(); ++i)
        if (const auto at = detail::decode_message<detail::ps_status_msg>(calls[i].reply_meta, "status").global_step;
            at < most) {
          behind.push_back(i);
          if (calls[i].peer != 0) missed.emplace(calls[i].peer, at);
        }
      if (behind.empty()) break;
      // A ps behind ps 0 misses a decision its committers did not forward (they died after it
      // was made): ps 0 gives it, this worker forwards it (dtf/ps/sync_protocol.hpp).
      for (const auto& [ps, at] : missed) this->forward_decision(ps, at);
      if (std::chrono::steady_clock::now() > deadline)
        throw error(errc::timeout, "pull: ps." + std::to_string(calls[behind[0]].peer) + " did not reach step " +
                                       std::to_string(most) + " within " + std::to_string(rpc_.options().timeout_ms) +
                                       " ms");
      auto again = read_parts(behind);
      for (std::size_t j = 0; j < behind.size(); ++j) calls[behind[j]] = std::move(again[j]);
    }
    if (track) {  // the least update count of a ps's parts: staleness is over-, never under-, counted
      std::vector<std::uint64_t> least(layout_.num_ps, std::numeric_limits<std::uint64_t>::max());
      for (const auto& c : calls)
        least[c.peer] = std::min(least[c.peer], detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").updates);
      for (std::size_t ps = 0; ps < least.size(); ++ps)
        if (least[ps] != std::numeric_limits<std::uint64_t>::max()) seen_[ps] = least[ps];
    }
    track_done(calls);
    return step_of(calls);
  }


 public:
  /// Sets the init/restore message's configuration.
  static void set_config(detail::ps_init_msg& m, const ps_config& config) {
    m.rule = detail::rule_msg::from(config.rule);
    m.lock_free = config.mode == apply_mode::lock_free;
    m.replicas_to_aggregate = config.replicas_to_aggregate;
    m.num_workers = config.num_workers;
  }

  /// Sends gradients; each ps applies its update rule (with `learning_rate` when given; with
  /// scale_by_staleness at that rate times 1 / (staleness + 1)). Advances the global step when
  /// increment_step.
  push_result push_gradients(std::span<const float> grads, std::optional<float> learning_rate = std::nullopt,
                             bool increment_step = true, bool scale_by_staleness = false) {
    return push(grads.size(), host_payload{*this, grads}, detail::gradient_kind(scale_by_staleness), learning_rate,
                increment_step, grads);
  }

  /// Sends deltas that each ps adds to its values; with scale_by_staleness (DynSGD) each ps
  /// first multiplies them by 1 / (staleness + 1).
  push_result push_deltas(std::span<const float> deltas, bool increment_step = true,
                          bool scale_by_staleness = false) {
    return push(deltas.size(), host_payload{*this, deltas},
                scale_by_staleness ? detail::update_kind::scaled_delta : detail::update_kind::delta, std::nullopt,
                increment_step, deltas);
  }

  /// Synchronous contribution for global step `step`: returns when the step is complete
  /// (N contributions averaged and applied on every ps) or at once when `step` is already
  /// finished (the contribution is dropped: result.dropped). With delta the average is added;
  /// otherwise each ps applies its rule to it (at `learning_rate` when given).
  /// Errors: errc::peer_failure when fewer than N replicas remain; errc::timeout.
  /// `rows`: an embedding model's row gradients (or deltas) of the step, each ps's part carried
  /// with its dense part, averaged over the same N contributions and applied lazily with the
  /// step by the table's rule (its own rate); a dropped contribution's rows go nowhere.
  /// `position`: this task's data position once the contribution is trained; ps 0 records it
  /// when the step completes (with it, before any contributor is released), so a checkpoint of
  /// that step holds it, and not for a dropped or skipped contribution.
  sync_result push_sync(std::span<const float> buf, std::int64_t step, std::optional<float> learning_rate = std::nullopt,
                        bool delta = false, std::span<const sync_rows> rows = {},
                        const data::position* position = nullptr) {
    // ps 0 admits a contribution before the other ps see their parts: it applies the
    // non-finite policy to the whole contribution (a NaN in another ps's part included), so no
    // ps can refuse a part ps 0 admitted and leave its step waiting.
    bool finite = std::all_of(buf.begin(), buf.end(), [](float x) { return std::isfinite(x); });
    for (const auto& r : rows)
      finite = finite && std::all_of(r.rows.begin(), r.rows.end(), [](float x) { return std::isfinite(x); });
    return sync_push(buf.size(), host_payload{*this, buf}, step, learning_rate, delta, rows, position, finite);
  }

 private:
  template <class Attach>
  sync_result sync_push(std::size_t n, Attach attach, std::int64_t step, std::optional<float> learning_rate,
                        bool delta, std::span<const sync_rows> rows = {},
                        const data::position* position = nullptr, bool all_finite = true) {
    return this->contribute(n, attach, step, learning_rate, delta, rows, position, all_finite);
  }

 public:
  /// The global step (held by ps 0).
  std::int64_t global_step() {
    rpc_call c = make_call(0, detail::message_kind::ps_step, detail::encode_message(detail::empty_msg{}));
    rpc_.call(c);
    return detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").global_step;
  }

  /// Ends the job: every ps replies and exits. The chief calls this when training is done.
  void shutdown() {
    auto calls = broadcast(detail::message_kind::ps_shutdown);
    run(calls);
  }

  /// Reconnects to every ps whose connection failed (a restarted ps comes back on the same
  /// address), retrying until transport_options::connect_timeout_ms.
  void reconnect() { rpc_.connect_all(); }

 public:
  // ---- for dtf/ps/checkpointing.hpp (and tools that speak the ps protocol) ----
  /// Shard ids held by ps `ps`.
  const std::vector<std::uint32_t>& shards_of(std::size_t ps) const { return ids_.at(ps); }
  /// A request to ps `ps`.
  rpc_call request(std::size_t ps, detail::message_kind kind, std::vector<std::byte> meta) const {
    return make_call(ps, kind, std::move(meta));
  }
  /// Sends the requests in parallel; returns when every reply is in (errors: see rpc_client).
  void call_all(std::vector<rpc_call>& calls) { run(calls); }
  /// The transport options of the client's connections.
  const transport_options& transport() const noexcept { return rpc_.options(); }
  /// Throws errc::shape_mismatch when a buffer of n floats does not cover the placement.
  void check_size(std::size_t n, const char* what) const {
    std::size_t total = 0;
    for (const auto& s : layout_.shards) total = std::max(total, s.offset + s.size);
    if (n < total)
      throw error(errc::shape_mismatch, std::string("ps_client::") + what + ": buffer of " + std::to_string(n) +
                                            " floats, the placement covers " + std::to_string(total));
  }

 private:
  static std::vector<std::uint32_t> to_ids(const std::vector<std::size_t>& v) {
    return std::vector<std::uint32_t>(v.begin(), v.end());
  }

  rpc_call make_call(std::size_t ps, detail::message_kind kind, std::vector<std::byte> meta) const {
    rpc_call c;
    c.peer = ps;
    c.kind = kind;
    c.meta = std::move(meta);
    return c;
  }

  void scatter(rpc_call& c, const std::vector<std::uint32_t>& ids, std::span<float> buf) const {
    for (auto id : ids)
      c.reply_payload.push_back(
          asio::buffer(buf.data() + layout_.shards[id].offset, layout_.shards[id].size * sizeof(float)));
  }

  void gather(rpc_call& c, const std::vector<std::uint32_t>& ids, std::span<const float> buf) const {
    for (auto id : ids)
      c.payload.push_back(asio::buffer(buf.data() + layout_.shards[id].offset, layout_.shards[id].size * sizeof(float)));
  }

  std::vector<rpc_call> broadcast(detail::message_kind kind) const {
    std::vector<rpc_call> calls;
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps)
      calls.push_back(make_call(ps, kind, detail::encode_message(detail::empty_msg{})));
    return calls;
  }

  // `host`: the values when they are in host memory; a ps's part that may be applied as it
  // arrives (several shards, at least transport_options::pieces_min_bytes) then says whether
  // it is all finite (dtf/ps/push_pieces.hpp).
  template <class Attach>
  push_result push(std::size_t n, Attach attach, detail::update_kind kind, std::optional<float> lr,
                   bool increment_step, std::span<const float> host = {}) {
    check_size(n, "push");
    std::vector<rpc_call> calls;
    std::vector<std::size_t> of;  // each call's part
    const auto& parts = parts_for("push");
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const auto& [ps, ids] = parts[i];
      // ps 0 holds the global step, so it always gets a push (possibly of no shards). A push in
      // parts counts as one update, with its last part (which advances the step on ps 0).
      if (ids.empty() && !(ps == 0 && increment_step)) continue;
      const bool last = i + 1 == parts.size() || parts[i + 1].first != ps;
      detail::ps_push_msg m{ids, kind, lr, increment_step && ps == 0 && last, seen_[ps], std::nullopt, last};
      std::size_t floats = 0;
      for (auto id : ids) floats += layout_.shards[id].size;
      if (!host.empty() && ids.size() > 1 && floats * sizeof(float) >= rpc_.options().pieces_min_bytes) {
        bool finite = true;
        for (auto id : ids) {
          const auto part = host.subspan(layout_.shards[id].offset, layout_.shards[id].size);
          finite = finite && std::all_of(part.begin(), part.end(), [](float x) { return std::isfinite(x); });
        }
        m.all_finite = finite;
      }
      calls.push_back(make_call(ps, detail::message_kind::ps_push, detail::encode_message(m)));
      of.push_back(i);
    }
    run(calls, [&](std::size_t j, rpc_call& c) { attach(c, parts[of[j]].first, parts[of[j]].second); },
        [](const rpc_call&) {});
    track_done(calls);
    push_result r;
    r.global_step = step_of(calls);
    for (const auto& c : calls) {
      const auto st = detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status");
      r.staleness = std::max(r.staleness, st.staleness);
      r.skipped = r.skipped || st.skipped;
    }
    return r;
  }

  // The global step: ps 0's; in synchronous training the least over the ps replying, so a
  // pull's tag never claims a step a ps whose values it returned has not reached (a
  // contribution tagged with it is then at worst dropped, never averaged into a later step).
  std::int64_t step_of(const std::vector<rpc_call>& calls) const {
    std::int64_t step = -1, least = std::numeric_limits<std::int64_t>::max();
    bool sync = false;
    for (const auto& c : calls) {
      const auto st = detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status");
      if (c.peer == 0) step = st.global_step;
      sync = sync || st.synchronous;
      least = std::min(least, st.global_step);
    }
    return sync ? least : step;
  }

  void run(std::vector<rpc_call>& calls) {
    ps_detail::run_in_rounds(calls, [this](std::vector<rpc_call>& round) { rpc_.call_all(std::span<rpc_call>(round)); });
  }
  // before(i, call) just before call i's round, after(call) once it is answered (request_parts.hpp).
  template <class Before, class After>
  void run(std::vector<rpc_call>& calls, Before&& before, After&& after) {
    ps_detail::run_in_rounds(calls, [this](std::vector<rpc_call>& round) { rpc_.call_all(std::span<rpc_call>(round)); },
                             before, after);
  }

  placement layout_;
  rpc_client rpc_;
  std::vector<std::vector<std::uint32_t>> ids_;  // shard ids held by each ps
  std::vector<std::uint64_t> seen_;              // each ps's update count at the last pull
  mutable std::optional<part_list> parts_;       // parts_for's cut
};

}  // namespace dtf
