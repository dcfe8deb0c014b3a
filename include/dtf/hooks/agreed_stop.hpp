// dtf/hooks/agreed_stop.hpp — every rank of a collective job stops after the same step.
//
//   session.add_hook(dtf::hooks::agreed_stop{&comm});   // add it last: it sees the others' requests
//
// After each step the ranks allreduce (max) "a stop was requested here" — by another hook
// (a step limit, the NaN check) or by a signal counted by dtf::hooks::stop_on_signal (which
// reaches one task: dtfrun signals the chief) — and every rank requests the stop when any
// did. With one rank no message is sent. Errors: those of the communicator.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/hooks/stop_on_signal.hpp>
#include <dtf/session.hpp>

#include <span>

namespace dtf::hooks {

/// Hook: every rank of a collective job stops after the same step. After each step the ranks
/// allreduce (max) "a stop was requested here", and every rank requests the stop when any did
/// (add it last, so that it sees the other hooks' requests). With one rank no message is sent.
/// Errors: those of the communicator.
struct agreed_stop {
  /// The communicator of the job's ranks (every rank adds the hook).
  communicator* comm;
  /// dtf::session_hook: after each step, with the step's values.
  void after_run(run_context& ctx, const run_values&) {
    const bool here = ctx.stop_requested() || stop_on_signal::stopped_by_signal();
    if (comm->size() <= 1) {
      if (here) ctx.request_stop();
      return;
    }
    float stop[1] = {here ? 1.0f : 0.0f};
    comm->allreduce("session/stop", std::span<float>(stop), reduce_op::max);
    if (stop[0] > 0) ctx.request_stop();
  }
};

}  // namespace dtf::hooks
