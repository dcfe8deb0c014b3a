// dtf/train/report.hpp — what every role of dtf::train shares around the steps: the standard
// hooks of a session, histograms for summaries, the chief's final report and metrics file.
#pragma once

#include <dtf/error.hpp>
#include <dtf/hooks/logging.hpp>
#include <dtf/hooks/nan_tensor.hpp>
#include <dtf/hooks/step_counter.hpp>
#include <dtf/hooks/stop_at_step.hpp>
#include <dtf/hooks/summary_saver.hpp>
#include <dtf/session.hpp>
#include <dtf/summary.hpp>
#include <dtf/train/options.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dtf::detail {

/// Writes {"accuracy", "loss", "global_step", "wall_s", "workers"} to `path` through a
/// temporary file renamed over it, so that a reader sees the whole object or nothing.
inline void write_metrics_file(const std::string& path, double accuracy, double loss, std::int64_t global_step,
                               double wall_s, std::size_t workers) {
  const std::filesystem::path target(path);
  const std::filesystem::path temporary = target.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    char json[256];
    std::snprintf(json, sizeof json,
                  "{\"accuracy\": %.6f, \"loss\": %.6f, \"global_step\": %lld, \"wall_s\": %.3f, \"workers\": %zu}\n",
                  accuracy, loss, static_cast<long long>(global_step), wall_s, workers);
    out << json;
    out.flush();
    if (!out) throw error(errc::io_error, "metrics_file: cannot write '" + temporary.string() + "'");
  }
  std::error_code ec;
  std::filesystem::rename(temporary, target, ec);
  if (ec)
    throw error(errc::io_error, "metrics_file: cannot rename '" + temporary.string() + "' to '" + target.string() +
                                    "': " + ec.message());
}

/// The hooks every session gets, in this order: the step limit, the NaN check, progress lines;
/// then the chief's summaries with model_dir. Returns the event file's writer (or nullptr).
inline std::shared_ptr<summary_writer> add_standard_hooks(monitored_training_session& s, const train_options& o,
                                                          std::optional<std::int64_t> last, const std::string& me,
                                                          bool is_chief) {
  const hooks::stop_at_step* stop = nullptr;
  if (o.last_step > 0) last = o.last_step;
  if (last) stop = &s.add_hook(hooks::stop_at_step({.last_step = *last}));
  if (o.num_steps > 0) stop = &s.add_hook(hooks::stop_at_step({.num_steps = o.num_steps}));
  s.add_hook(hooks::nan_tensor(
      {.policy = o.nan_policy,
       .warn = [me](const std::string& w) { std::fprintf(stderr, "%s: %s\n", me.c_str(), w.c_str()); }}));
  s.add_hook(hooks::logging({.every_n_iter = o.log_every, .prefix = me, .stop = stop}));
  if (o.model_dir.empty() || !is_chief) return nullptr;
  auto writer = std::make_shared<summary_writer>(o.model_dir);
  s.add_chief_hook(hooks::step_counter({.every_n_steps = o.summary_every > 0 ? o.summary_every : 100, .writer = writer}));
  if (o.summary_every > 0) s.add_chief_hook(hooks::summary_saver({.every_n_steps = o.summary_every, .writer = writer}));
  return writer;
}

/// Copies every variable of the flat host `params` into values.histograms when summaries are due.
inline void add_histograms(const run_context& ctx, const std::vector<variable_spec>& vars,
                           std::span<const float> params, run_values& values) {
  if (!ctx.summaries_requested()) return;
  for (const auto& v : vars)
    values.histograms[v.name].assign(params.begin() + std::ptrdiff_t(v.offset),
                                     params.begin() + std::ptrdiff_t(v.offset + v.size()));
}

/// The chief's final lines: the evaluation line (without an evaluation, when `done_line`, a
/// "done at global step" line: a ps job's tasks print their own done lines) and the RESULT line.
inline void print_result(const train_options& o, const std::string& me, std::size_t workers,
                         const std::optional<nn::evaluation>& e, std::int64_t global_step, double wall,
                         const std::string& before_accuracy, const std::string& after, bool done_line = true) {
  if (e) {
    std::printf("%s: final test accuracy %.4f  test_loss %.4f  global_step %lld  wall %.1fs\n", me.c_str(),
                e->accuracy, e->loss, static_cast<long long>(global_step), wall);
    std::string metrics;  // the evaluation's own figures, last, so the tokens before keep their places
    for (const auto& [name, value] : e->metrics) {
      char token[96];
      std::snprintf(token, sizeof token, " %s=%.4f", name.c_str(), value);
      metrics += token;
    }
    std::printf("RESULT scheme=%s workers=%zu %saccuracy=%.4f wall_s=%.1f %s%s\n", o.name.c_str(), workers,
                before_accuracy.c_str(), e->accuracy, wall, after.c_str(),
                metrics.c_str() + (after.empty() && !metrics.empty() ? 1 : 0));
  } else {
    if (done_line)
      std::printf("%s: done at global step %lld  wall %.1fs\n", me.c_str(), static_cast<long long>(global_step), wall);
    std::printf("RESULT scheme=%s workers=%zu %swall_s=%.1f %s\n", o.name.c_str(), workers, before_accuracy.c_str(),
                wall, after.c_str());
  }
  std::fflush(stdout);
}

/// After the chief's final lines: the metrics file, then the exit code (1 below the target accuracy).
inline int check_result(const train_options& o, const std::string& me, std::size_t workers,
                        const std::optional<nn::evaluation>& e, std::int64_t global_step, double wall) {
  if (!o.metrics_file.empty())
    write_metrics_file(o.metrics_file, e ? e->accuracy : 0.0, e ? e->loss : 0.0, global_step, wall, workers);
  const double accuracy = e ? e->accuracy : 0.0;
  if (o.target_accuracy > 0 && accuracy < o.target_accuracy) {
    std::fprintf(stderr, "%s: test accuracy %.4f is below the target %.4f\n", me.c_str(), accuracy,
                 o.target_accuracy);
    return 1;
  }
  return 0;
}

/// The chief's final report: evaluation line, RESULT line, metrics file; returns the exit code.
inline int report_result(const train_options& o, const std::string& me, std::size_t workers,
                         const std::optional<nn::evaluation>& e, std::int64_t global_step, double wall,
                         const std::string& before_accuracy, const std::string& after) {
  print_result(o, me, workers, e, global_step, wall, before_accuracy, after);
  return check_result(o, me, workers, e, global_step, wall);
}
}  // namespace dtf::detail
