// bench_session_overhead — what a monitored_training_session and its hooks cost per step, and
// how fast summaries are written, measured side by side in one run.
//
//   1. the same trivial step (one scalar update) in a bare loop and inside a session with the
//      standard hooks of the examples (stop_at_step, nan_tensor, logging, step_counter,
//      summary_saver writing every --summary_every steps): nanoseconds per step of each and
//      the difference — the session's fixed cost per step, to compare with a training step
//      (milliseconds for the examples' MLP)
//   2. summary_writer: scalars per second (one Value per event), and histograms per second of
//      a variable of --histogram_floats floats, with the event file's bytes per second
// Results are checked before they are printed: the session ran exactly --steps steps and the
// event file holds what was written.
//
//   build/benchmarks/bench_session_overhead [--steps 2000000] [--summary_every 1000]
//       [--histogram_floats 100000] [--dir /tmp/dtf_session_bench]
#include <dtf/flags.hpp>
#include <dtf/hooks.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <vector>

int main(int argc, char** argv) try {
  std::int64_t steps = 2000000, summary_every = 1000;
  int histogram_floats = 100000;
  std::string dir = "/tmp/dtf_session_bench";
  dtf::flag_parser flags("Per-step cost of monitored_training_session with the standard hooks; summary write rates.");
  flags.add("steps", steps, "steps of each loop")
      .add("summary_every", summary_every, "summary_saver and step_counter interval (global steps)")
      .add("histogram_floats", histogram_floats, "floats per histogram")
      .add("dir", dir, "directory for the event files (removed at the end)");
  if (!flags.parse(argc, argv)) return 0;
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  std::filesystem::remove_all(dir);

  // 1. Bare loop vs session.
  volatile double sink = 0;
  const auto t0 = clock::now();
  for (std::int64_t i = 0; i < steps; ++i) sink = sink + 1e-9 * double(i);
  const auto t1 = clock::now();
  auto writer = std::make_shared<dtf::summary_writer>(dir + "/session");
  dtf::monitored_training_session s;
  s.add_hook(dtf::hooks::stop_at_step({.last_step = steps}));
  s.add_hook(dtf::hooks::nan_tensor());
  std::int64_t lines = 0;
  s.add_hook(dtf::hooks::logging({.every_n_iter = std::max<std::int64_t>(1, steps / 10),
                                  .sink = [&](const std::string&) { ++lines; }}));
  s.add_hook(dtf::hooks::step_counter({.every_n_steps = summary_every, .writer = writer}));
  auto& saver = s.add_hook(dtf::hooks::summary_saver({.every_n_steps = summary_every, .writer = writer}));
  const auto t2 = clock::now();
  const auto last = s.train([&](dtf::run_context& c) {
    sink = sink + 1e-9 * double(c.global_step());
    dtf::run_values v;
    v.loss = 0.5;
    v.scalars["learning_rate"] = 0.1;
    return v;
  });
  const auto t3 = clock::now();
  if (last != steps || lines != 10 || saver.writes() < steps / summary_every)
    throw dtf::error(dtf::errc::internal, "session ran " + std::to_string(last) + " steps, " + std::to_string(lines) +
                                              " log lines, " + std::to_string(saver.writes()) + " summaries");
  const double bare_ns = 1e9 * secs(t0, t1) / double(steps), session_ns = 1e9 * secs(t2, t3) / double(steps);
  std::printf("steps %lld  bare loop %.1f ns/step  session with 5 hooks %.1f ns/step  overhead %.1f ns/step\n",
              static_cast<long long>(steps), bare_ns, session_ns, session_ns - bare_ns);

  // 2. Summary write rates.
  dtf::summary_writer w(dir + "/writer");
  const int scalars = 200000, histograms = 200;
  const auto t4 = clock::now();
  for (int i = 0; i < scalars; ++i) w.add_scalar("loss", 1.0 / (i + 1), i);
  w.flush();
  const auto t5 = clock::now();
  std::vector<float> values(static_cast<std::size_t>(histogram_floats));
  std::iota(values.begin(), values.end(), -0.5f * float(histogram_floats));
  for (auto& v : values) v *= 1e-4f;
  for (int i = 0; i < histograms; ++i) w.add_histogram("dense/kernel", values, i);
  w.flush();
  const auto t6 = clock::now();
  const auto bytes = std::filesystem::file_size(w.path());
  if (bytes < std::uintmax_t(scalars) * 20) throw dtf::error(dtf::errc::internal, "the event file is too small");
  std::printf("summary_writer  %.2f M scalars/s  %.0f histograms/s of %d floats (%.0f M floats/s)  file %.1f MB\n",
              double(scalars) / secs(t4, t5) / 1e6, double(histograms) / secs(t5, t6), histogram_floats,
              double(histograms) * double(histogram_floats) / secs(t5, t6) / 1e6, double(bytes) / 1e6);
  std::filesystem::remove_all(dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_session_overhead: %s\n", e.what());
  return 1;
}
