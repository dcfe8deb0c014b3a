// dtf/hooks/logging.hpp — progress lines every N iterations or every S seconds.
//
// Iterations are this task's runs (TensorFlow's LoggingTensorHook counts them too), so a
// worker's lines keep coming at the same pace whatever the other workers do.
// A line carries key=value tokens (the contract dtfrun's live view parses):
//   <prefix>: step=1200 last_step=5000 loss=0.4123 steps_per_sec=85.3 lr=0.1 staleness_mean=1.2
// step is the global step; last_step appears when known (option, or a stop_at_step's);
// loss is the mean of the losses since the previous line; steps_per_sec is global steps per
// second since the previous line (since the session started for the first line); every named
// scalar of the latest run_values follows as name=value. Lines go to stdout (flushed) unless a
// sink is given.
#pragma once

#include <dtf/hooks/stop_at_step.hpp>
#include <dtf/hooks/timer.hpp>
#include <dtf/session.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace dtf::hooks {

/// When and where a logging hook writes.
struct logging_options {
  std::int64_t every_n_iter = 100;  ///< iterations (this task's runs) between lines; 0: not by count
  double every_secs = 0;            ///< 0: not by time
  std::string prefix;                ///< e.g. "worker.0" (the line starts "<prefix>: ")
  /// The last global step, reported as last_step=.
  std::optional<std::int64_t> last_step;
  /// A stop_at_step hook whose last step the lines report (when last_step is not set); it must
  /// outlive the session (e.g. the reference add_hook returned).
  const stop_at_step* stop = nullptr;
  bool at_end = false;  ///< also log at a successful end when steps ran since the last line
  std::function<void(const std::string&)> sink;  ///< default: stdout
};

/// Hook: a progress line every N iterations (this task's runs) or every S seconds, made of
/// key=value tokens (the contract dtfrun's live view parses):
/// `<prefix>: step=1200 last_step=5000 loss=0.4123 steps_per_sec=85.3 lr=0.1 ...`
/// (the global step, the last step when known, the mean loss since the previous line, global
/// steps per second, then every named scalar of the latest run_values).
class logging {
 public:
  /// Logs as `o` says.
  explicit logging(logging_options o = {}) : options_(std::move(o)), timer_(options_.every_n_iter, options_.every_secs) {}

  /// dtf::session_hook: after restore or initialisation, at the start step.
  void after_create_session(run_context& ctx) {
    timer_.update(0);
    last_global_step_ = ctx.global_step();
    last_time_ = step_timer::clock::now();
  }

  /// dtf::session_hook: after each step, with the step's values.
  void after_run(run_context& ctx, const run_values& v) {
    if (v.loss) {
      loss_sum_ += *v.loss;
      ++loss_count_;
    }
    for (const auto& landed : v.landed_losses) {  // a step that reads its losses through a ring
      loss_sum_ += landed.second;
      ++loss_count_;
    }
    const std::int64_t iteration = ctx.local_step() + 1;  // runs completed, this one included
    const bool now = timer_.should_trigger(iteration);
    if (now || options_.at_end) scalars_ = v.scalars;  // a copy only when a line may need it
    if (now) emit(iteration, ctx.global_step());
  }

  /// dtf::session_hook: once, at close or on error (`status` carries the error).
  void end(run_context& ctx, const run_status& status) {
    if (options_.at_end && status.ok() && loss_count_ > 0) emit(ctx.local_step(), ctx.global_step());
  }

  /// The last line written ("" before the first).
  const std::string& last_line() const noexcept { return last_line_; }
  /// The lines written so far.
  std::int64_t lines() const noexcept { return lines_; }

 private:
  void emit(std::int64_t iteration, std::int64_t step);

  logging_options options_;
  step_timer timer_;
  double loss_sum_ = 0;
  std::int64_t loss_count_ = 0, lines_ = 0;
  std::map<std::string, double> scalars_;
  std::string last_line_;
  std::int64_t last_global_step_ = 0;
  step_timer::clock::time_point last_time_{};
};
static_assert(session_hook<logging>);

inline void logging::emit(std::int64_t iteration, std::int64_t step) {
  timer_.update(iteration);
  const auto now = step_timer::clock::now();
  const double secs = std::chrono::duration<double>(now - last_time_).count();
  const std::int64_t steps = step - last_global_step_;
  last_time_ = now;
  last_global_step_ = step;
  std::string line = options_.prefix.empty() ? std::string() : options_.prefix + ": ";
  char buf[96];
  std::snprintf(buf, sizeof buf, "step=%lld", static_cast<long long>(step));
  line += buf;
  std::optional<std::int64_t> last = options_.last_step;
  if (!last && options_.stop) last = options_.stop->last_step();
  if (last) {
    std::snprintf(buf, sizeof buf, " last_step=%lld", static_cast<long long>(*last));
    line += buf;
  }
  if (loss_count_ > 0) {
    std::snprintf(buf, sizeof buf, " loss=%.4f", loss_sum_ / double(loss_count_));
    line += buf;
  }
  if (secs > 0) {
    std::snprintf(buf, sizeof buf, " steps_per_sec=%.1f", double(steps) / secs);
    line += buf;
  }
  for (const auto& [name, value] : scalars_) {
    std::snprintf(buf, sizeof buf, "=%.6g", value);
    line += " " + name + buf;
  }
  loss_sum_ = 0;
  loss_count_ = 0;
  ++lines_;
  last_line_ = line;
  if (options_.sink) {
    options_.sink(line);
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

}  // namespace dtf::hooks
