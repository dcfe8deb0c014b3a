// dtf/hooks/timer.hpp — "every N steps or every S seconds", the trigger most hooks share.
//
// Like TensorFlow's SecondOrStepTimer: a timer triggers for a step when it never triggered,
// or when at least every_steps global steps or every_secs seconds passed since it last did.
// Both zero: it never triggers. Not thread-safe (a hook's own state).
#pragma once

#include <dtf/error.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace dtf::hooks {

/// "Every N steps or every S seconds", the trigger most hooks share (TensorFlow's
/// SecondOrStepTimer): it triggers for a step when it never triggered, or when at least
/// every_steps global steps or every_secs seconds passed since it last did; both zero: never.
/// Not thread-safe.
class step_timer {
 public:
  /// The clock of every_secs.
  using clock = std::chrono::steady_clock;

  /// What passed between two triggers.
  struct elapsed {
    /// Seconds.
    double secs = 0;
    /// Global steps.
    std::int64_t steps = 0;
  };

  step_timer() = default;
  /// every_steps and every_secs must not be negative (dtf::error invalid_argument).
  step_timer(std::int64_t every_steps, double every_secs) : every_steps_(every_steps), every_secs_(every_secs) {
    if (every_steps < 0 || every_secs < 0)
      throw error(errc::invalid_argument, "step_timer: every_steps (" + std::to_string(every_steps) +
                                              ") and every_secs (" + std::to_string(every_secs) +
                                              ") must not be negative");
  }

  /// Whether the timer can trigger at all (every_steps or every_secs set).
  bool enabled() const noexcept { return every_steps_ > 0 || every_secs_ > 0; }

  /// Whether the timer triggers for global step `step` at time `now`.
  bool should_trigger(std::int64_t step, clock::time_point now = clock::now()) const noexcept {
    if (!enabled()) return false;
    if (!last_step_) return true;
    if (step == *last_step_) return false;
    if (every_steps_ > 0 && step >= *last_step_ + every_steps_) return true;
    if (every_secs_ > 0 && std::chrono::duration<double>(now - last_time_).count() >= every_secs_) return true;
    return false;
  }

  /// Marks `step` as triggered; returns what passed since the previous trigger (nullopt for
  /// the first).
  std::optional<elapsed> update(std::int64_t step, clock::time_point now = clock::now()) noexcept {
    std::optional<elapsed> e;
    if (last_step_) e = elapsed{std::chrono::duration<double>(now - last_time_).count(), step - *last_step_};
    last_step_ = step;
    last_time_ = now;
    return e;
  }

  /// The global step it last triggered for (nullopt: never).
  std::optional<std::int64_t> last_triggered_step() const noexcept { return last_step_; }

 private:
  std::int64_t every_steps_ = 0;
  double every_secs_ = 0;
  std::optional<std::int64_t> last_step_;
  clock::time_point last_time_{};
};

}  // namespace dtf::hooks
