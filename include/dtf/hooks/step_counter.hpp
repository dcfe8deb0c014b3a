// dtf/hooks/step_counter.hpp — global steps per second (and examples per second).
//
// Every N global steps or S seconds, measures the global steps and the examples this task ran
// since the previous measurement and, when given a summary_writer, writes the scalars
// "global_step/sec" and "examples/sec" (this task's examples) at the current global step.
// With a ps, the global step advances with every worker's updates, so global_step/sec is the
// job's rate, not this task's. Usually a chief-only hook.
#pragma once

#include <dtf/hooks/timer.hpp>
#include <dtf/session.hpp>
#include <dtf/summary.hpp>

#include <cstdint>
#include <memory>

namespace dtf::hooks {

/// When a step_counter measures, and where it writes.
struct step_counter_options {
  std::int64_t every_n_steps = 100;  ///< 0: not by steps
  double every_secs = 0;             ///< 0: not by time
  std::shared_ptr<summary_writer> writer;  ///< optional
};

/// Hook: every N global steps or S seconds, measures global steps per second and this task's
/// examples per second and, when given a summary_writer, writes them as the scalars
/// "global_step/sec" and "examples/sec". Usually a chief-only hook.
class step_counter {
 public:
  /// Measures as `o` says.
  explicit step_counter(step_counter_options o = {})
      : options_(std::move(o)), timer_(options_.every_n_steps, options_.every_secs) {}

  /// dtf::session_hook: after restore or initialisation, at the start step.
  void after_create_session(run_context& ctx) { timer_.update(ctx.global_step()); }

  /// dtf::session_hook: after each step, with the step's values.
  void after_run(run_context& ctx, const run_values& v) {
    examples_ += v.examples;
    if (!timer_.should_trigger(ctx.global_step())) return;
    const auto e = timer_.update(ctx.global_step());
    if (!e || e->secs <= 0) return;
    steps_per_sec_ = double(e->steps) / e->secs;
    examples_per_sec_ = double(examples_) / e->secs;
    examples_ = 0;
    ++measurements_;
    if (options_.writer) {
      options_.writer->add_scalars({{"global_step/sec", steps_per_sec_}, {"examples/sec", examples_per_sec_}},
                                   ctx.global_step());
      options_.writer->flush();
    }
  }

  /// The latest measurement (0 before the first).
  ///@{
  double steps_per_sec() const noexcept { return steps_per_sec_; }
  double examples_per_sec() const noexcept { return examples_per_sec_; }
  ///@}
  /// The number of measurements made.
  std::int64_t measurements() const noexcept { return measurements_; }

 private:
  step_counter_options options_;
  step_timer timer_;
  std::size_t examples_ = 0;
  double steps_per_sec_ = 0, examples_per_sec_ = 0;
  std::int64_t measurements_ = 0;
};
static_assert(session_hook<step_counter>);

}  // namespace dtf::hooks
