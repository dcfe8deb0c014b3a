// dtf/strategies/exchange_health.hpp — when a host wait on a device exchange (NCCL) gives up: the
// progress rule of docs/design/gpu-execution.md, section 6.1.
//
//   detail::progress_bound bound(std::chrono::milliseconds(timeout_ms));
//   detail::step_marks<Event> marks(64);                 // an event recorded after each step
//   marks.mark([&](Event& e) { record(e, compute); });   // after each step's update
//   const auto since = clock::now();                     // a host wait begins
//   while (!done()) {
//     bound.observe(marks.completed(query), clock::now());
//     if (bound.expired(since, clock::now())) abort_and_throw();
//   }
//
// No step waits on the host for the exchange: its health is checked where the host waits anyway
// (a read of the parameters, a loss ring's drain). A wait fails when no step has completed for
// the bound since the later of the wait's start and the last completion seen, so a host many
// steps ahead of a healthy device does not time out while the device keeps completing steps,
// and a dead peer (NCCL's kernels waiting forever, every later step with them) is noticed within
// the bound of the host's next wait. Every build; the CUDA exchange uses it with cudaEvent_t and
// cudaEventQuery, the CPU tests with stand-ins.
// Thread safety: none (the engine's thread).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtf::strategies::detail {

/// The progress rule (see the file comment).
class progress_bound {
 public:
  using clock = std::chrono::steady_clock;
  /// Waits give up after `bound` without a completed step.
  explicit progress_bound(std::chrono::milliseconds bound) : bound_(bound) {}

  /// `completed` steps are known complete at `now` (a count that never decreases).
  void observe(std::uint64_t completed, clock::time_point now) {
    if (completed > completed_) {
      completed_ = completed;
      last_ = now;
    }
  }
  /// Whether a wait that began at `since` has run out at `now`: no step completed within the
  /// bound since the later of `since` and the last completion observed.
  bool expired(clock::time_point since, clock::time_point now) const { return now - std::max(since, last_) > bound_; }
  /// The steps observed complete so far.
  std::uint64_t completed() const noexcept { return completed_; }
  /// The bound.
  std::chrono::milliseconds bound() const noexcept { return bound_; }

 private:
  std::chrono::milliseconds bound_;
  std::uint64_t completed_ = 0;
  clock::time_point last_{};
};

/// One event per step, recorded after the step's work, in a ring of `slots` reused events: how
/// many steps are known complete. A slot is recorded again once `slots` newer steps were marked;
/// the steps it marked before are then counted complete when a newer one is (one stream: a later
/// step completes after the earlier ones).
template <class Event>
class step_marks {
 public:
  /// `slots` events (at least 1), value-initialised: the owner creates them (events()).
  explicit step_marks(std::size_t slots) : events_(std::max<std::size_t>(slots, 1)) {}

  /// The events, for their owner to create and destroy.
  std::vector<Event>& events() noexcept { return events_; }
  /// Marks the next step: record(event) records its slot's event after the step's work.
  template <class Record>
  void mark(Record&& record) {
    record(events_[issued_ % events_.size()]);
    ++issued_;
  }
  /// The steps known complete: query(event) says whether an event's last record has completed
  /// (never waits), asked from the oldest step not yet seen complete.
  template <class Query>
  std::uint64_t completed(Query&& query) {
    if (issued_ - landed_ > events_.size()) landed_ = issued_ - events_.size();  // slots recorded again
    while (landed_ < issued_ && query(events_[landed_ % events_.size()])) ++landed_;
    return landed_;
  }
  /// The steps marked so far.
  std::uint64_t issued() const noexcept { return issued_; }

 private:
  std::vector<Event> events_;
  std::uint64_t issued_ = 0, landed_ = 0;
};

}  // namespace dtf::strategies::detail
