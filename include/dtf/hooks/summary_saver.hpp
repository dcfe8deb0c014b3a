// dtf/hooks/summary_saver.hpp — writes the step's values to a TensorBoard event file.
//
// Every N global steps or S seconds: in before_run it asks the step for summaries
// (ctx.request_summaries(), so the step copies its variables only then), and in after_run it
// writes, at the step's global step, the scalar "loss" (for a step that reads its losses through a
// ring, the one of that step when it landed: dtf::train reads the ring when summaries are asked
// for), every named scalar of run_values, and
// every entry of run_values::histograms as a histogram. The writer is flushed after each write
// and at end. Usually a chief-only hook.
#pragma once

#include <dtf/hooks/timer.hpp>
#include <dtf/session.hpp>
#include <dtf/summary.hpp>

#include <cstdint>
#include <memory>

namespace dtf::hooks {

/// When a summary_saver writes, and where.
struct summary_saver_options {
  std::int64_t every_n_steps = 100;  ///< 0: not by steps
  double every_secs = 0;             ///< 0: not by time
  std::shared_ptr<summary_writer> writer;  ///< required
};

/// Hook: every N global steps or S seconds writes the step's loss, named scalars and histograms to
/// a TensorBoard event file (asking the step for summaries in before_run). Usually a chief-only
/// hook.
class summary_saver {
 public:
  /// Errors: dtf::error(invalid_argument) without a writer.
  explicit summary_saver(summary_saver_options o)
      : options_(std::move(o)), timer_(options_.every_n_steps, options_.every_secs) {
    if (!options_.writer) throw error(errc::invalid_argument, "summary_saver: no summary_writer given");
  }

  /// dtf::session_hook: before each step.
  void before_run(run_context& ctx) {
    requested_ = timer_.should_trigger(ctx.global_step() + 1);
    if (requested_) ctx.request_summaries();
  }

  /// dtf::session_hook: after each step, with the step's values.
  void after_run(run_context& ctx, const run_values& v) {
    if (!requested_) return;
    requested_ = false;
    const std::int64_t step = ctx.global_step();
    timer_.update(step);
    auto scalars = v.scalars;
    if (v.loss) scalars["loss"] = *v.loss;
    else if (!v.landed_losses.empty() && v.landed_losses.back().first == step) scalars["loss"] = v.landed_losses.back().second;
    options_.writer->add_scalars(scalars, step);
    for (const auto& [tag, values] : v.histograms) options_.writer->add_histogram(tag, values, step);
    options_.writer->flush();
    ++writes_;
  }

  /// dtf::session_hook: once, at close or on error (`status` carries the error).
  void end(run_context&, const run_status&) { options_.writer->flush(); }

  /// Summaries written so far.
  std::int64_t writes() const noexcept { return writes_; }
  /// The writer the summaries go to.
  const std::shared_ptr<summary_writer>& writer() const noexcept { return options_.writer; }

 private:
  summary_saver_options options_;
  step_timer timer_;
  bool requested_ = false;
  std::int64_t writes_ = 0;
};
static_assert(session_hook<summary_saver>);

}  // namespace dtf::hooks
