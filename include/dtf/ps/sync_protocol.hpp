// dtf/ps/sync_protocol.hpp — the decisions of the synchronous protocol over several ps, as
// state machines without I/O or values (docs/design/sync-protocol.md states the protocol and
// its invariants; tests/test_sync_protocol.cpp enumerates its interleavings).
//
// A contribution's id is (worker identity, incarnation, sequence); its rate, its kind and
// learning rate. For step t a worker:
//   1. stages its part on every ps p > 0 (sync_staging::stage), each acknowledging it with a
//      receipt once it holds the whole part (sync_staging::receipt); a part larger than one
//      request is staged in segments, in order, and ps 0's part too, all but its last segment
//      staged on ps 0 (sync_staging::held);
//   2. then commits on ps 0 with ps 0's part (its last segment) and the receipts
//      (sync_admission::commit): ps 0 refuses a commit without a receipt of every ps p > 0
//      (dtf/ps/sync_proofs.hpp), groups the commits of t by rate, and the first rate with
//      commits of N workers decides t: the set S_t (each worker's first commit of that rate),
//      at that rate, signed; the commits of other rates are refused. ps 0 applies its parts, advances, and answers every committer of t: a commit
//      for a step already decided is answered at once with that decision;
//   3. forwards S_t to every ps p > 0 (sync_staging::parts_of, then advance): a decision ps 0
//      did not sign is refused; the first genuine arrival applies the staged parts of S_t, in
//      S_t's order, and discards the others; later ones are answered at once.
// A pull that finds ps p behind ps 0 asks ps 0 for the decision ps p misses and forwards it, so
// a step completes everywhere once decided while one worker lives. Staging, committing and
// forwarding the same message again changes nothing (a timed-out request can be retried).
// A synchronous checkpoint: the chief holds ps 0's decisions (sync_admission::hold) at its step
// t, brings every ps to t (forwarding decisions), has every ps save the state of t, and
// releases the hold: every file of the checkpoint holds step t.
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/error.hpp>
#include <dtf/ps/sync_proofs.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtf::ps_detail {


/// ps 0: which commits each step admits. Copyable (the interleaving test copies states).
class sync_admission {
 public:
  /// The decisions kept for late committers and for pulls that find a ps behind: ps p is never
  /// more than one step behind ps 0, so two would do.
  static constexpr std::size_t kept_decisions = 8;

  enum class verdict {
    pending,    ///< recorded; its answer waits for the step's decision
    duplicate,  ///< this id is already recorded for the step (a retry): it waits as before
    overflow,   ///< held with a rate full: not recorded, answered (dropped) once the step is decided
    admitted,   ///< in `decision` (decided by this commit, or before it: a retry)
    dropped,    ///< the step was decided without it (`decision`, when still kept)
  };
  /// A commit recorded for the current step.
  struct entry {
    contribution_id id;
    step_rate rate;
    bool operator==(const entry&) const = default;
  };
  struct result {
    verdict v = verdict::pending;
    std::optional<sync_decision> decision;
    bool decided_now = false;  ///< this commit completed the step
    std::vector<entry> refused;  ///< decided_now: the step's commits of another rate
  };

  /// N per step from `step`; `proofs`: this ps's key and the ps count (none: nothing required).
  void reset(std::size_t n, std::int64_t step, sync_proofs proofs = {}) {
    n_ = n;
    step_ = step;
    current_.clear();
    past_.clear();
    held_ = false;
    proofs_ = std::move(proofs);
  }

  /// What commit() checks before it records a commit to the current step: the receipts of
  /// every ps p > 0 for (step, id, rate) (sync_proofs::check_receipts). Throws
  /// errc::invalid_argument (to the committer alone: nothing changes).
  void check(const contribution_id& id, std::int64_t step, const step_rate& rate,
             const std::vector<sync_receipt>& receipts) const {
    proofs_.check_receipts(receipts, step, id, rate);
  }

  /// Records id's commit to `step` at `rate`, with the receipts of the other ps. The step is
  /// decided by the first rate with commits of N workers (names: a worker's other lives and
  /// retries do not count twice, and one name alone decides nothing when N > 1): S_t is each of
  /// those workers' first commit of that rate; the step's commits of other rates are refused
  /// (result::refused), its other commits dropped. Throws errc::invalid_argument (nothing
  /// recorded) for a step not reached yet, or receipts that do not prove the part staged on
  /// every other ps (check()). A commit for a decided step is admitted when in its decision,
  /// else dropped.
  result commit(const contribution_id& id, std::int64_t step, const step_rate& rate = {},
                const std::vector<sync_receipt>& receipts = {}) {
    if (step > step_)
      throw error(errc::invalid_argument, describe(id) + " committed to step " + std::to_string(step) +
                                              " but ps 0 is at step " + std::to_string(step_));
    if (step < step_) {
      const auto d = decision_of(step);
      if (d && std::find(d->ids.begin(), d->ids.end(), id) != d->ids.end()) return {verdict::admitted, d, false, {}};
      return {verdict::dropped, d, false, {}};
    }
    if (recorded(id)) return {verdict::duplicate, {}, false, {}};
    check(id, step, rate, receipts);
    if (held_ && full()) return {verdict::overflow, {}, false, {}};
    current_.push_back({id, rate});
    if (held_ || of_rate(rate) < n_) return {verdict::pending, {}, false, {}};
    return decide(rate);
  }

  /// The error of a commit of `rate` to step d.step, which d decided at another rate.
  static std::string refusal(const contribution_id& id, const step_rate& rate, const sync_decision& d) {
    return describe(id) + " contributed " + describe(rate) + " to step " + std::to_string(d.step) + ", which ps 0 decided with " +
           describe(d.rate) + ": refused (the step's rate is its decision's)";
  }

  /// Stops deciding: the step stays at its number until release() (commits are recorded, up to
  /// N). Returns the step held.
  std::int64_t hold() noexcept {
    held_ = true;
    return step_;
  }
  /// Decides again: the held step's decision when a rate has N commits recorded meanwhile.
  std::optional<result> release() {
    held_ = false;
    if (n_ == 0) return std::nullopt;
    for (const auto& e : current_)
      if (of_rate(e.rate) >= n_) return decide(e.rate);
    return std::nullopt;
  }
  bool held() const noexcept { return held_; }
  /// Whether a rate has N commits recorded (held: the step waits for its release).
  bool full() const {
    return std::any_of(current_.begin(), current_.end(), [&](const entry& e) { return of_rate(e.rate) >= n_; });
  }
  /// Whether id's commit is recorded for the current step.
  bool recorded(const contribution_id& id) const {
    return std::any_of(current_.begin(), current_.end(), [&](const entry& e) { return e.id == id; });
  }
  /// Whether a commit of `worker` at `rate` would be its first of that rate in the current step
  /// (the one a decision at that rate takes).
  bool first_of(const std::string& worker, const step_rate& rate) const {
    return std::none_of(current_.begin(), current_.end(),
                        [&](const entry& e) { return e.id.worker == worker && e.rate == rate; });
  }

 private:
  // The workers with a commit of `rate` recorded.
  std::size_t of_rate(const step_rate& rate) const {
    std::size_t k = 0;
    for (std::size_t i = 0; i < current_.size(); ++i)
      k += current_[i].rate == rate && std::none_of(current_.begin(), current_.begin() + std::ptrdiff_t(i), [&](const entry& e) {
             return e.rate == rate && e.id.worker == current_[i].id.worker;
           });
    return k;
  }
  result decide(const step_rate& rate) {
    sync_decision d{step_, {}, rate, {}};
    std::vector<entry> refused;
    std::vector<std::string> in;  // the workers in d
    for (auto& e : current_) {
      if (e.rate != rate)
        refused.push_back(std::move(e));
      else if (std::find(in.begin(), in.end(), e.id.worker) == in.end() && d.ids.size() < n_) {
        in.push_back(e.id.worker);
        d.ids.push_back(std::move(e.id));
      }
    }
    proofs_.sign(d);
    current_.clear();
    past_.push_back(d);
    if (past_.size() > kept_decisions) past_.pop_front();
    ++step_;
    return {verdict::admitted, std::move(d), true, std::move(refused)};
  }

 public:

  /// The decision of a finished step, when still kept.
  std::optional<sync_decision> decision_of(std::int64_t step) const {
    for (const auto& d : past_)
      if (d.step == step) return d;
    return std::nullopt;
  }

  std::int64_t step() const noexcept { return step_; }
  std::size_t replicas() const noexcept { return n_; }
  /// The current step's commits, in arrival order.
  const std::vector<entry>& pending() const noexcept { return current_; }
  bool operator==(const sync_admission&) const = default;

 private:
  std::size_t n_ = 0;
  std::int64_t step_ = 0;
  bool held_ = false;
  std::vector<entry> current_;  // the current step's commits, in arrival order
  std::deque<sync_decision> past_;
  sync_proofs proofs_;
};

/// ps p > 0: the parts staged for its current step, and the decided sets that apply them.
/// Part: what a staged contribution holds (the server's values; the test's nothing).
template <class Part>
class sync_staging {
 public:
  /// A worker may have this many parts staged for a step (a restarted worker's earlier life
  /// may still be decided; a skipped contribution is followed by another): memory stays
  /// bounded by the workers' names.
  static constexpr std::size_t parts_per_worker = 4;

  enum class verdict { staged, duplicate, stale };

  /// N per step from `step`; `proofs`: this ps's key and index (none: nothing signed or checked).
  void reset(std::size_t n, std::int64_t step, sync_proofs proofs = {}) {
    n_ = n;
    step_ = step;
    staged_.clear();
    proofs_ = std::move(proofs);
  }

  /// Stages segment k of the `count` segments of id's part for `step` (a part larger than one
  /// request arrives in segments, in order: docs/design/large-models.md); merge(held, segment)
  /// appends segment k > 0 to the part held. A retry keeps what was staged first (so every ps
  /// holds what ps 0 may admit): a segment already in is a duplicate. A part for a step applied
  /// here already is stale. Throws errc::invalid_argument for a step ahead of this ps, past the
  /// parts a worker may have staged, a segment before the previous one, or a count that
  /// differs from the part's first segment's.
  template <class Merge>
  verdict stage(const contribution_id& id, std::int64_t step, std::uint32_t k, std::uint32_t count, Part&& segment,
                Merge&& merge) {
    if (step < step_) return verdict::stale;
    if (step > step_)
      throw error(errc::invalid_argument, describe(id) + " staged a part for step " + std::to_string(step) +
                                              " but this ps is at step " + std::to_string(step_));
    if (count == 0 || k >= count)
      throw error(errc::invalid_argument, describe(id) + " staged segment " + std::to_string(k) + " of " +
                                              std::to_string(count));
    if (const auto it = staged_.find(id); it != staged_.end()) {
      auto& e = it->second;
      if (count != e.count)
        throw error(errc::invalid_argument, describe(id) + " staged a part in " + std::to_string(count) +
                                                " segments, its first segment said " + std::to_string(e.count));
      if (k < e.received) return verdict::duplicate;
      if (k > e.received)
        throw error(errc::invalid_argument, describe(id) + " staged segment " + std::to_string(k) +
                                                " of its part before segment " + std::to_string(e.received));
      merge(e.part, std::move(segment));
      ++e.received;
      return verdict::staged;
    }
    if (k != 0)
      throw error(errc::invalid_argument, describe(id) + " staged segment " + std::to_string(k) +
                                              " of a part whose segment 0 is not staged here");
    std::size_t lives = 0;
    for (const auto& [key, e] : staged_) lives += key.worker == id.worker;
    if (lives >= parts_per_worker)
      throw error(errc::invalid_argument, id.worker + " has " + std::to_string(lives) + " parts staged for step " +
                                              std::to_string(step_) + " already");
    staged_.emplace(id, entry{std::move(segment), 1, count});
    return verdict::staged;
  }
  /// A part in one segment.
  verdict stage(const contribution_id& id, std::int64_t step, Part&& part) {
    return stage(id, step, 0, 1, std::move(part), [](Part&, Part&&) {});
  }

  /// This ps's receipt for id's part of the current step, of `rate` (the part's), when every
  /// segment of it is staged here; nullopt otherwise.
  std::optional<sync_receipt> receipt(const contribution_id& id, const step_rate& rate) const {
    const auto it = staged_.find(id);
    if (it == staged_.end() || it->second.received != it->second.count) return std::nullopt;
    return proofs_.receipt(step_, id, rate);
  }

  /// The staged parts of decision d, in d's order, to apply now; nullopt when d's step was
  /// applied here already (a second forward). Throws errc::invalid_argument for a decision ps 0
  /// did not sign (sync_proofs::genuine: forged or altered; nothing changes), one that is ahead
  /// of this ps or not a set of N distinct ids; errc::internal when one of its ids has no part
  /// staged here (with proofs, only across a restore; the ps fails loudly).
  std::optional<std::vector<Part*>> parts_of(const sync_decision& d) {
    if (!proofs_.genuine(d))
      throw error(errc::invalid_argument, "a decision of step " + std::to_string(d.step) +
                                              " that ps 0 did not make (its proof does not match): refused");
    if (d.step < step_) return std::nullopt;
    if (d.step > step_)
      throw error(errc::invalid_argument, "decision of step " + std::to_string(d.step) + " forwarded to a ps at step " +
                                              std::to_string(step_));
    std::vector<contribution_id> sorted = d.ids;
    std::sort(sorted.begin(), sorted.end());
    if (d.ids.size() != n_ || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      throw error(errc::invalid_argument, "decision of step " + std::to_string(d.step) + " holds " +
                                              std::to_string(d.ids.size()) + " ids, not " + std::to_string(n_) +
                                              " distinct ones");
    std::vector<Part*> parts;
    for (const auto& id : d.ids) {
      const auto it = staged_.find(id);
      if (it == staged_.end())
        throw error(errc::internal, "step " + std::to_string(d.step) + " was decided with " + describe(id) +
                                        ", whose part was never staged here");
      if (it->second.received != it->second.count)
        throw error(errc::internal, "step " + std::to_string(d.step) + " was decided with " + describe(id) + ", of whose " +
                                        std::to_string(it->second.count) + " segments only " +
                                        std::to_string(it->second.received) + " were staged here");
      parts.push_back(&it->second.part);
    }
    return parts;
  }

  /// ps 0: the part id staged in `received` of its `count` segments (the commit carries the
  /// last), or nullptr when what is staged for it is not exactly that.
  Part* held(const contribution_id& id, std::uint32_t count, std::uint32_t received) {
    const auto it = staged_.find(id);
    if (it == staged_.end() || it->second.count != count || it->second.received != received) return nullptr;
    return &it->second.part;
  }

  /// After the parts of the step's decision were applied: discards every staged part.
  void advance() {
    staged_.clear();
    ++step_;
  }

  std::int64_t step() const noexcept { return step_; }
  std::size_t staged() const noexcept { return staged_.size(); }
  /// The parts `worker` has staged for the current step (whole or not).
  std::size_t staged_of(const std::string& worker) const {
    std::size_t k = 0;
    for (const auto& [key, e] : staged_) k += key.worker == worker;
    return k;
  }
  /// The segments id's part has (0: none staged).
  std::uint32_t count(const contribution_id& id) const {
    const auto it = staged_.find(id);
    return it == staged_.end() ? 0 : it->second.count;
  }
  bool holds(const contribution_id& id) const { return staged_.count(id) > 0; }
  /// The segments of id's part staged so far (0: none).
  std::uint32_t received(const contribution_id& id) const {
    const auto it = staged_.find(id);
    return it == staged_.end() ? 0 : it->second.received;
  }
  std::vector<contribution_id> staged_ids() const {
    std::vector<contribution_id> ids;
    for (const auto& [id, e] : staged_) ids.push_back(id);
    return ids;
  }

 private:
  std::size_t n_ = 0;
  std::int64_t step_ = 0;
  struct entry {
    Part part;
    std::uint32_t received = 0, count = 1;  // segments staged, of the part's count
  };
  std::map<contribution_id, entry> staged_;
  sync_proofs proofs_;
};

}  // namespace dtf::ps_detail
