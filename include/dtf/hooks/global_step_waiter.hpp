// dtf/hooks/global_step_waiter.hpp — holds a task back until the global step reaches a value.
//
// Before each run, while the global step (read afresh through ctx.read_global_step(), e.g.
// from the ps) is below wait_until_step, it polls every poll_ms. TensorFlow uses this to let
// the chief get ahead before workers join (gradual warm-up). A stop request ends the wait
// (the run is then skipped). Errors: dtf::error(timeout) when the step is not reached within
// timeout_ms.
#pragma once

#include <dtf/error.hpp>
#include <dtf/session.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace dtf::hooks {

/// What a global_step_waiter waits for.
struct global_step_waiter_options {
  /// The global step to wait for.
  std::int64_t wait_until_step = 0;
  int poll_ms = 100;        ///< polling interval
  int timeout_ms = 600000;  ///< give up after this long
};

/// Hook: holds a task back, before each run, until the global step (read afresh) reaches
/// wait_until_step (TensorFlow's gradual warm-up of workers). A stop request ends the wait.
/// Errors: dtf::error(errc::timeout) when the step is not reached within timeout_ms.
class global_step_waiter {
 public:
  /// Waits as `o` says. Errors: errc::invalid_argument when poll_ms or timeout_ms is not positive.
  explicit global_step_waiter(global_step_waiter_options o) : options_(o) {
    if (o.poll_ms <= 0 || o.timeout_ms <= 0)
      throw error(errc::invalid_argument, "global_step_waiter: poll_ms and timeout_ms must be positive");
  }

  /// dtf::session_hook: before each step.
  void before_run(run_context& ctx) {
    if (reached_) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
    while (ctx.read_global_step() < options_.wait_until_step) {
      if (ctx.stop_requested()) {
        ctx.skip_run();
        return;
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw error(errc::timeout, "global_step_waiter: global step " + std::to_string(ctx.global_step()) +
                                       " did not reach " + std::to_string(options_.wait_until_step) + " within " +
                                       std::to_string(options_.timeout_ms) + " ms");
      ++polls_;
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.poll_ms));  // polling interval
    }
    reached_ = true;
  }

  /// Whether the global step was reached.
  bool reached() const noexcept { return reached_; }
  /// The polls made so far.
  std::int64_t polls() const noexcept { return polls_; }

 private:
  global_step_waiter_options options_;
  bool reached_ = false;
  std::int64_t polls_ = 0;
};
static_assert(session_hook<global_step_waiter>);

}  // namespace dtf::hooks
