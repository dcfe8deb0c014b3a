// dtf/ps/sync_aggregator.hpp — synchronous aggregation on one ps (SyncReplicasOptimizer), in
// the protocol of dtf/ps/sync_protocol.hpp: on ps 0 the first N commits of a step are averaged
// and applied (through shard_store::apply), the step advances and every committer is released
// with the decision; on ps p > 0 parts are staged and a forwarded decision applies the average
// of its parts. A part larger than one request arrives in segments (dtf/ps/sync_part.hpp): on
// ps p > 0 every segment is staged, on ps 0 all but the last, which the commit carries.
// Contributions for an older step are dropped and counted per worker.
// A contribution may carry rows of embedding tables: each row any contributor sent is summed
// over the step's contributions, divided by N (a contributor that did not touch a row counts
// as a zero gradient, as in a dense step) and applied once with the step by the table's rule,
// lazily; a dropped contribution's rows are dropped with it.
// A contribution is recorded only after it is validated (its step, its shard ids: exactly the
// shards this ps holds, its size, its values' finiteness, its rate's, on ps 0 the receipts of
// every other ps: dtf/ps/sync_proofs.hpp): a malformed one is an error to its sender alone and
// changes nothing. It is attributed to the authenticated connection's identity, never to a
// name in the message. The step's rate (kind and learning rate) is its decision's: ps 0 sums,
// as they arrive, the commits of the rate of the step's first, keeps a copy of any other, and
// remakes the sums from the copies when another rate decides the step; commits of a rate the
// decision does not have are errors to their senders. On ps p > 0 a decision ps 0 did not sign
// is an error to its sender.
//
// An apply that fails part-way (bad_alloc in copy on write) fails the ps loudly: every waiting
// and later synchronous request gets the error. Liveness: connections that pulled or contributed
// count; when one ends without a done report, fewer than N workers left fail every synchronous
// request naming it, N or more (backups) go on and it counts as done.
//
// Thread safety: every member takes the aggregator's mutex.
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/ps/shard_store.hpp>
#include <dtf/ps/sync_part.hpp>
#include <dtf/ps/sync_protocol.hpp>
#include <dtf/ps/sync_sums.hpp>
#include <dtf/transport.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::ps_detail {

class sync_aggregator {
 public:
  /// What a request did, when it is answered at once.
  struct outcome {
    bool dropped = false;            ///< for a finished step (with its decision when kept)
    std::uint64_t dropped_total = 0;
    bool skipped = false;            ///< non-finite values, nonfinite_policy::skip
    std::optional<sync_decision> decision;
    std::optional<sync_receipt> receipt;  ///< a stage that completed a part (or its retry)
  };

  ~sync_aggregator() { clear_waiting(); }

  /// N replicas per step (0: asynchronous) over the store's shards, from step `step`, with this
  /// ps's proofs (sync_proofs::of: its key, index and the ps count). Waiting contributors get
  /// `reason` as an error (they retry).
  void configure(std::size_t n, const shard_store& store, std::int64_t step, const std::string& reason,
                 const sync_proofs& proofs = {}) {
    std::lock_guard g(mu_);
    for (auto& w : waiting_) w.second.send(rpc_reply::failure(errc::peer_failure, reason));
    for (auto& w : overflow_) w.second.send(rpc_reply::failure(errc::peer_failure, reason));
    waiting_.clear();
    overflow_.clear();
    holder_.clear();
    n_ = n;
    sums_.reset(store, n_ > 0);
    step_ = step;
    admission_.reset(n, step, proofs);
    staging_.reset(n, step, proofs);
    positions_.clear();
    failure_.clear();
    broken_ = false;
    kind_.reset();
  }

  /// ps 0: validates and records `who`'s commit (`payload` its dense shards, `rows` its embedding
  /// rows). The N-th averages, applies with `apply(shard id, update)` and tables.apply_rows (any
  /// row sent, its sum / N: an untouched row counts as a zero gradient), advances the step and
  /// releases every committer with `status(reply, decision, dropped, dropped_total)` after
  /// `advanced(new step, positions)` (the positions the step's contributions carried).
  /// tables.reserve_rows(rows) checks the ids (and makes a hashed table's rows) last before
  /// recording. A retry waits on the new request; a commit for a decided step, and the one that
  /// completes a step, are answered with the decision. Returns nullopt when deferred.
  template <class Tables, class Apply, class Advanced, class Status>
  std::optional<outcome> contribute(const std::string& who, const detail::ps_sync_push_msg& m,
                                    std::span<const std::byte> payload, std::span<const contributed_rows> rows,
                                    const shard_store& store, Tables& tables, nonfinite_policy policy,
                                    const std::function<rpc_responder()>& defer, Apply&& apply, Advanced&& advanced,
                                    Status&& status) {
    std::lock_guard g(mu_);
    if (n_ == 0) throw error(errc::invalid_argument, "synchronous push to a ps initialised for asynchronous training");
    expire_hold(tables, apply, advanced, status);
    const contribution_id id{who, m.incarnation, m.sequence};
    if (m.step < step_) {
      auto r = admission_.commit(id, m.step, m.rate());
      if (r.v == sync_admission::verdict::admitted) return outcome{false, 0, false, std::move(r.decision)};
      return outcome{true, ++dropped_[who], false, std::move(r.decision)};
    }
    if (!failure_.empty()) throw error(errc::peer_failure, failure_);
    if (m.step > step_)
      throw error(errc::invalid_argument, who + " contributed for step " + std::to_string(m.step) +
                                              " but the ps is at step " + std::to_string(step_));
    for (auto& [wid, w] : waiting_)
      if (wid == id) {  // a retry: its first bytes count, the new request gets the answer
        w.send(rpc_reply::failure(errc::peer_failure, "superseded by a retry of the same contribution"));
        w = defer();
        return std::nullopt;
      }
    if (admission_.held() && admission_.full()) {  // answered once the step is decided
      overflow_.emplace_back(id, defer());
      return std::nullopt;
    }
    // A part in segments: all but the last staged here first (dtf/ps/sync_part.hpp).
    const staged_part* earlier = m.segments > 1 ? staging_.held(id, m.segments, m.segments - 1) : nullptr;
    if (m.segments > 1 && (!earlier || m.segment + 1 != m.segments))
      throw error(errc::invalid_argument, describe(id) + " committed segment " + std::to_string(m.segment) + " of " +
                                              std::to_string(m.segments) + " with " +
                                              std::to_string(staging_.received(id)) + " staged here before it");
    const auto in = check_part(who, step_, m, payload, rows, store, sums_.dense, policy, earlier);
    if (!in) return outcome{false, 0, true, {}, {}};
    admission_.check(id, m.step, m.rate(), m.receipts);  // every other ps holds the whole part
    // Summed as it arrives when of the rate of the step's first commit and its worker's first
    // of it (what a decision at that rate takes); else a copy, summed only if it is in the
    // decision (bounded per worker as staged parts are; refused before anything is recorded).
    const bool summed = !kind_ || (step_rate{*kind_, lr_} == m.rate() && admission_.first_of(who, m.rate()));
    if (!summed && staging_.received(id) == 0 &&
        staging_.staged_of(who) >= sync_staging<staged_part>::parts_per_worker)
      throw error(errc::invalid_argument, who + " has " + std::to_string(staging_.staged_of(who)) +
                                              " contributions recorded for step " + std::to_string(step_) + " already");
    tables.reserve_rows(rows);  // last: ids not held here, repeated or beyond a full table throw
    // Valid: record it.
    if (summed) {
      kind_ = m.kind;
      lr_ = m.learning_rate;
      if (earlier) sums_.add(earlier->ids, earlier->dense, {});
      sums_.add(m.ids, *in, rows);
    } else {
      staging_.stage(id, m.step, m.segment, m.segments, staged_part(m, *in, rows), staged_part::join);
    }
    if (m.position) positions_[who] = *m.position;
    auto r = admission_.commit(id, m.step, m.rate(), m.receipts);
    if (!r.decided_now) {
      waiting_.emplace_back(id, defer());
      return std::nullopt;
    }
    // This commit completes the step: answered by the return (or by the exception of an apply
    // that failed part-way: never also through a responder).
    decided(*r.decision, r.refused, tables, apply, advanced, status);
    return outcome{false, 0, false, std::move(r.decision), {}};
  }

  /// ps 0, a synchronous checkpoint (dtf/ps/sync_protocol.hpp): stops deciding steps, for
  /// `holder` (a connection) until release() or until `until` (checked at the next commit).
  /// Returns the step held; nullopt in asynchronous training.
  std::optional<std::int64_t> hold(const std::string& holder, std::chrono::steady_clock::time_point until) {
    std::lock_guard g(mu_);
    if (n_ == 0) return std::nullopt;
    holder_ = holder;
    hold_until_ = until;
    return admission_.hold();
  }
  /// Ends the hold of `holder` (any holder when empty): the held step is decided when its N
  /// commits are in, as in contribute().
  template <class Tables, class Apply, class Advanced, class Status>
  void release(const std::string& holder, Tables& tables, Apply&& apply, Advanced&& advanced, Status&& status) {
    std::lock_guard g(mu_);
    if (holder_.empty() || (!holder.empty() && holder != holder_)) return;
    holder_.clear();
    if (auto r = admission_.release()) decided(*r->decision, r->refused, tables, apply, advanced, status);
  }

  /// ps p > 0: validates and stages `who`'s part of a step, or a segment of it (a retry keeps
  /// what was staged first), answered with this ps's receipt once the part is whole; on ps 0,
  /// the segments of its part before the commit's. A part for a step finished here is
  /// answered dropped.
  template <class Tables>
  outcome stage(const std::string& who, const detail::ps_sync_push_msg& m, std::span<const std::byte> payload,
                std::span<const contributed_rows> rows, const shard_store& store, Tables& tables,
                nonfinite_policy policy) {
    std::lock_guard g(mu_);
    if (n_ == 0) throw error(errc::invalid_argument, "synchronous part sent to a ps initialised for asynchronous training");
    const contribution_id id{who, m.incarnation, m.sequence};
    if (m.step < step_) return outcome{true, 0, false, {}, {}};  // ps 0 answers its commit (dropped)
    if (!failure_.empty()) throw error(errc::peer_failure, failure_);
    if (m.step > step_)
      throw error(errc::invalid_argument, who + " staged a part for step " + std::to_string(m.step) +
                                              " but the ps is at step " + std::to_string(step_));
    if (staging_.received(id) > m.segment) return outcome{false, 0, false, {}, receipt(id)};  // a retry
    const staged_part* earlier = m.segment > 0 ? staging_.held(id, m.segments, m.segment) : nullptr;
    if (m.segment > 0 && !earlier)
      throw error(errc::invalid_argument, describe(id) + " staged segment " + std::to_string(m.segment) + " of " +
                                              std::to_string(m.segments) + " with " +
                                              std::to_string(staging_.received(id)) + " staged here before it");
    // Non-finite values: ps 0 applies the policy to the whole contribution (all_finite); a part
    // it may admit is staged whatever it holds, unless the policy rejects it outright.
    const auto in = check_part(who, step_, m, payload, rows, store, sums_.dense,
                               policy == nonfinite_policy::reject ? policy : nonfinite_policy::apply, earlier);
    tables.reserve_rows(rows);  // here, before ps 0 can admit the part: never after
    staged_part part(m, *in, rows);
    if (m.segment == 0 && m.segments > 1) part.dense.reserve(sums_.floats);  // the segments join in place
    staging_.stage(id, m.step, m.segment, m.segments, std::move(part), staged_part::join);
    return outcome{false, 0, false, {}, receipt(id)};
  }

  /// ps p > 0: applies decision d (its staged parts averaged at its rate, as ps 0 did) and
  /// advances; false when d's step was applied here already. A decision ps 0 did not sign is an
  /// error to its sender (nothing changes). One naming a part never staged here, or staged at
  /// another rate (without a secret, or across a restore: sync-protocol.md), fails the ps
  /// loudly (the steps of the ps would no longer be one model's).
  template <class Tables, class Apply, class Advanced>
  bool apply_decision(const sync_decision& d, Tables& tables, Apply&& apply, Advanced&& advanced) {
    std::lock_guard g(mu_);
    if (n_ == 0) throw error(errc::invalid_argument, "synchronous decision sent to a ps initialised for asynchronous training");
    // A decided step completes even when too few workers are left for the next (the failure).
    if (broken_) throw error(errc::peer_failure, failure_);
    std::optional<std::vector<staged_part*>> parts;
    try {
      parts = staging_.parts_of(d);
    } catch (const error& e) {
      if (e.code() == make_error_code(errc::internal)) fail(e.message());
      throw;
    }
    if (!parts) return false;
    kind_ = d.rate.kind;
    lr_ = d.rate.learning_rate;
    for (const auto* p : *parts)
      if (p->kind != *kind_ || p->lr != lr_)
        fail("step " + std::to_string(d.step) + " was decided with " + describe(d.rate) +
             " and a part staged here of another rate");
    for (const auto* p : *parts) sums_.add(*p);
    finish(tables, apply, advanced);
    staging_.advance();
    return true;
  }

  /// ps 0: the decision of a finished step, when still kept.
  std::optional<sync_decision> decision_of(std::int64_t step) const {
    std::lock_guard g(mu_);
    return admission_.decision_of(step);
  }

  /// A connection of `who` (at `remote`) pulled or contributed: it counts as a live replica
  /// until it ends. An evaluator's or a ps's pulls do not: they contribute nothing.
  void seen(const std::string& remote, const std::string& who) {
    if (who.starts_with("evaluator.") || who.starts_with("ps.")) return;
    std::lock_guard g(mu_);
    if (n_ > 0 && !alive_.count(remote)) alive_.emplace(remote, who);
  }

  /// A connection ended: a worker gone without its done report leaves fewer than N replicas (fatal:
  /// every synchronous request fails naming it) or, with backups, enough (the caller counts it done).
  struct departure { std::string why; bool fatal = false; };
  std::optional<departure> disconnected(const std::string& remote, const std::string& who, bool finished) {
    std::lock_guard g(mu_);
    if (n_ == 0 || !alive_.erase(remote) || finished) return std::nullopt;
    std::set<std::string> live;
    for (const auto& [r, w] : alive_) live.insert(w);
    if (live.count(who) || !failure_.empty()) return std::nullopt;
    const auto left = std::to_string(live.size()) + " of the " + std::to_string(n_) + " replicas each step needs";
    if (live.size() >= n_) return departure{who + " left without its done report, leaving " + left + ": the steps go on without it, and it counts as finished"};
    fail_quietly("synchronous training cannot continue: " + who + " disconnected, leaving " + left);
    return departure{failure_, true};
  }

  std::map<std::string, std::uint64_t> dropped() const {
    std::lock_guard g(mu_);
    return dropped_;
  }

  /// Whether `who` is in the per-worker tables already, else how many names they hold (admitted as done reports are).
  std::pair<bool, std::size_t> named(const std::string& who) const {
    std::lock_guard g(mu_);
    if (dropped_.count(who) || std::any_of(alive_.begin(), alive_.end(), [&](const auto& a) { return a.second == who; }))
      return {true, 0};  // known: the names are counted for a new one only
    std::set<std::string> names;
    for (const auto& [w, n] : dropped_) names.insert(w);
    for (const auto& [r, w] : alive_) names.insert(w);
    return {false, names.size()};
  }

  /// N, the contributions a step aggregates (0: asynchronous training).
  std::size_t replicas() const {
    std::lock_guard g(mu_);
    return n_;
  }
  /// Commits waiting for their step's decision.
  std::size_t waiting() const {
    std::lock_guard g(mu_);
    return waiting_.size();
  }

  void clear_waiting() {
    std::lock_guard g(mu_);
    waiting_.clear();
    overflow_.clear();
  }

 private:
  // ps p > 0: this ps's receipt for id's part, when it holds all of it.
  std::optional<sync_receipt> receipt(const contribution_id& id) {
    const std::uint32_t k = staging_.received(id);
    const staged_part* p = k == 0 ? nullptr : staging_.held(id, staging_.count(id), k);
    if (!p) return std::nullopt;
    return staging_.receipt(id, step_rate{p->kind, p->lr});
  }

  // The step's N contributions are summed: average, apply, advance. An apply that throws part
  // way fails the ps (fail()): the shards would otherwise hold half a step.
  template <class Tables, class Apply, class Advanced>
  void finish(Tables& tables, Apply& apply, Advanced& advanced) {
    try {
      sums_.apply_dense(n_, *kind_, lr_, apply);
    } catch (const std::exception& e) {
      fail("step " + std::to_string(step_) + " failed part-way through its apply (" + e.what() +
           "): the ps's shards no longer hold one step");
    }
    sums_.apply_rows(n_, *kind_, tables);
    ++step_;
    kind_.reset();
    advanced(step_, positions_);
  }

  // Step d was decided: apply it, release its committers with the decision, the step's
  // commits of another rate (`refused`) with an error, and the commits that arrived while it
  // was held with N in, as dropped.
  template <class Tables, class Apply, class Advanced, class Status>
  void decided(const sync_decision& d, const std::vector<sync_admission::entry>& refused, Tables& tables, Apply& apply,
               Advanced& advanced, Status& status) {
    if (!kind_ || step_rate{*kind_, lr_} != d.rate) {  // not the rate summed: d's copies summed
      sums_.clear();
      std::optional<std::vector<staged_part*>> parts;
      try {
        parts = staging_.parts_of(d);
      } catch (const error& e) {
        fail("step " + std::to_string(d.step) + " was decided without its parts' copies here (" + e.message() + ")");
      }
      for (const auto* p : *parts) sums_.add(*p);
      kind_ = d.rate.kind;
      lr_ = d.rate.learning_rate;
    }
    finish(tables, apply, advanced);
    staging_.advance();  // the segments of the step's parts staged here
    positions_.clear();
    for (auto& [wid, w] : waiting_) {
      const auto no = std::find_if(refused.begin(), refused.end(), [&](const auto& e) { return e.id == wid; });
      if (no != refused.end()) {
        w.send(rpc_reply::failure(errc::invalid_argument, sync_admission::refusal(wid, no->rate, d)));
        continue;
      }
      rpc_reply out;  // in d, or of d's rate and not in it (a worker's second life): dropped
      const bool in = std::find(d.ids.begin(), d.ids.end(), wid) != d.ids.end();
      status(out, d, !in, in ? 0 : ++dropped_[wid.worker]);
      w.send(std::move(out));
    }
    waiting_.clear();
    for (auto& [wid, w] : overflow_) {
      rpc_reply out;
      status(out, d, true, ++dropped_[wid.worker]);
      w.send(std::move(out));
    }
    overflow_.clear();
  }
  // A hold past its time (its chief hung) ends at the next commit.
  template <class Tables, class Apply, class Advanced, class Status>
  void expire_hold(Tables& tables, Apply& apply, Advanced& advanced, Status& status) {
    if (holder_.empty() || std::chrono::steady_clock::now() < hold_until_) return;
    holder_.clear();
    if (auto r = admission_.release()) decided(*r->decision, r->refused, tables, apply, advanced, status);
  }

  // The ps's shards are no longer one step's: every waiting and later synchronous request
  // gets `why`.
  [[noreturn]] void fail(const std::string& why) {
    fail_quietly(why);
    broken_ = true;
    throw error(errc::peer_failure, failure_);
  }
  void fail_quietly(const std::string& why) {
    failure_ = why;
    for (auto& w : waiting_) w.second.send(rpc_reply::failure(errc::peer_failure, failure_));
    for (auto& w : overflow_) w.second.send(rpc_reply::failure(errc::peer_failure, failure_));
    waiting_.clear();
    overflow_.clear();
  }

  mutable std::mutex mu_;
  std::size_t n_ = 0;
  std::int64_t step_ = 0;
  sync_admission admission_;            // ps 0: the commits of each step
  sync_staging<staged_part> staging_;   // the parts of the current step (ps 0: segments before a commit)
  std::optional<detail::update_kind> kind_;  // the rate summed: of the current step's first commit
  std::optional<float> lr_;
  sync_sums sums_;  // the step's sums: of the rate of kind_ and lr_
  std::map<std::string, data::position> positions_;  // carried by the current step's contributions
  std::vector<std::pair<contribution_id, rpc_responder>> waiting_;  // committers of the current step
  std::vector<std::pair<contribution_id, rpc_responder>> overflow_;  // beyond N while held
  std::string holder_;  // the connection holding the decisions (a checkpoint), if any
  std::chrono::steady_clock::time_point hold_until_;
  std::map<std::string, std::string> alive_;         // live training connections: remote -> identity
  std::map<std::string, std::uint64_t> dropped_;
  std::string failure_;  // no step can complete (too few workers left, or broken_)
  bool broken_ = false;  // an apply failed part-way, or a decision named a part never staged
};

}  // namespace dtf::ps_detail
