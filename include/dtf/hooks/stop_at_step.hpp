// dtf/hooks/stop_at_step.hpp — stops the session at a global step.
//
// Either num_steps (counted from the global step the session starts at, i.e. after a restore)
// or last_step (absolute) — exactly one. The session stops once the global step reaches the
// last step; a session that starts at or beyond it stops before its first step.
// Errors: dtf::error(invalid_argument) when neither or both are set, or a value is negative.
#pragma once

#include <dtf/error.hpp>
#include <dtf/session.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace dtf::hooks {

/// The step a stop_at_step hook stops at: exactly one of num_steps and last_step.
struct stop_at_step_options {
  std::optional<std::int64_t> num_steps;  ///< steps to run from the start step
  std::optional<std::int64_t> last_step;  ///< global step to stop at
};

/// Hook: stops the session once the global step reaches the last step (num_steps after the start
/// step, or last_step). Errors: dtf::error(errc::invalid_argument) when neither or both are set,
/// or a value is negative.
class stop_at_step {
 public:
  /// Stops as `o` says (exactly one of num_steps and last_step).
  explicit stop_at_step(stop_at_step_options o) : options_(o) {
    if (o.num_steps.has_value() == o.last_step.has_value())
      throw error(errc::invalid_argument, "stop_at_step: set exactly one of num_steps and last_step");
    if (o.num_steps.value_or(0) < 0 || o.last_step.value_or(0) < 0)
      throw error(errc::invalid_argument, "stop_at_step: num_steps and last_step must not be negative");
  }

  /// dtf::session_hook: after restore or initialisation, at the start step.
  void after_create_session(run_context& ctx) {
    last_step_ = options_.last_step ? *options_.last_step : ctx.global_step() + *options_.num_steps;
    if (ctx.global_step() >= last_step_) ctx.request_stop();
  }
  /// dtf::session_hook: after each step, with the step's values.
  void after_run(run_context& ctx, const run_values&) {
    if (ctx.global_step() >= last_step_) ctx.request_stop();
  }

  /// The global step the session stops at (known after after_create_session).
  std::int64_t last_step() const noexcept { return last_step_; }

 private:
  stop_at_step_options options_;
  std::int64_t last_step_ = 0;
};
static_assert(session_hook<stop_at_step>);

}  // namespace dtf::hooks
