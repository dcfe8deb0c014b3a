// The main() of the synchronous examples (sync_sgd, sync_sgd_rates, sagn): as async_main, but
// training runs until the global step reaches epochs × (batches of a worker's shard) / (local
// steps per contribution) (or --last_step / --num_steps); every worker keeps drawing batches
// until then. The loop runs inside the standard monitored session (hooks.hpp).
// --slow_worker K --slow_ms M makes worker K's gradients take M ms longer (a straggler, for
// the benchmark). The RESULT line adds the chief's contributions and how many were dropped.
#pragma once

#include <dtf/strategies/sync.hpp>

#include "hooks.hpp"
#include "job.hpp"

namespace examples {

template <dtf::strategies::sync_strategy S>
int sync_main(int argc, char** argv, const char* scheme, const std::function<void(dtf::flag_parser&)>& add_flags,
              const std::function<S(std::size_t workers)>& make, job_defaults defaults = {}) try {
  int slow_worker = -1, slow_ms = 0;
  hook_flags hf;
  auto j = job::setup(argc, argv, scheme, [&](dtf::flag_parser& f) {
    f.add("slow_worker", slow_worker, "index of a worker to slow down (-1: none)")
        .add("slow_ms", slow_ms, "extra milliseconds per gradient of the slowed worker");
    hf.add_to(f);
    add_flags(f);
  }, defaults);
  if (!j) return 0;
  if (j->is_ps()) return j->run_ps();
  hf.validate();
  const auto client = j->connect();
  auto& ps = *client;
  S strategy = make(j->trainers);
  const std::int64_t epochs_last_step =
      std::int64_t(j->epochs) * std::int64_t(j->shard_batches(0) / strategy.steps_per_contribution());
  dtf::strategies::sync_worker<S, dtf::nn::sequential> worker(std::move(strategy), j->net, ps, j->trainer);
  if (int(j->trainer) == slow_worker) worker.set_compute_delay(std::chrono::milliseconds(slow_ms));
  standard_session session(*j, ps, hf, {
      .last_step = hf.last_step > 0 || hf.num_steps > 0 ? std::nullopt : std::optional(epochs_last_step),
      .init = [&] {
        worker.initialize_ps(j->seed);
        std::printf("%s: %s with %zu workers, %zu aggregated per step\n", j->me().c_str(), scheme, j->trainers,
                    worker.strategy().replicas_to_aggregate());
      },
      .ps_rule = worker.strategy().ps_rule(),
      .replicas_to_aggregate = worker.strategy().replicas_to_aggregate(),
      .restored = [&](std::span<const float> v) { std::copy(v.begin(), v.end(), worker.params().begin()); },
      .after_recovery = [&] { worker.begin(); }});
  session->create();
  // --num_steps counts from the step the session started at (after a restore).
  const std::int64_t last_step = hf.last_step > 0   ? hf.last_step
                                 : hf.num_steps > 0 ? session->global_step() + hf.num_steps
                                                    : epochs_last_step;
  worker.set_last_step(last_step);
  std::printf("%s: training to global step %lld (from %lld)\n", j->me().c_str(), static_cast<long long>(last_step),
              static_cast<long long>(session->global_step()));
  std::fflush(stdout);
  worker.begin();
  const auto train = j->train_shard(-1);
  const auto& d = worker.drops();
  const std::int64_t steps_per_epoch = std::max<std::int64_t>(1, epochs_last_step / j->epochs);
  std::int64_t next_epoch_eval = (session->global_step() / steps_per_epoch + 1) * steps_per_epoch;
  const std::int64_t first_step = session->global_step();
  const auto vars = j->net.variables();
  auto stream = train.stream();
  auto t0 = job::clock::now();
  while (!session->should_stop() && !worker.finished()) {
    auto b = stream.next();
    session->run([&](dtf::run_context& ctx) {
      dtf::run_values v;
      v.loss = session.recoverable([&] { return worker.step(*b); });
      // A worker that has not heard from the ps yet reports 0: the session's step is newer.
      v.global_step = std::max(worker.global_step(), ctx.global_step());
      v.examples = b->labels.size();
      v.scalars["contributions"] = double(d.contributions);
      v.scalars["dropped_gradients"] = double(d.dropped);
      if (defaults.learning_rate) v.scalars["learning_rate"] = defaults.learning_rate(*v.global_step, b->epoch);
      standard_session::add_variables(ctx, vars, worker.params(), v);
      return v;
    });
    if (j->is_chief() && worker.global_step() >= next_epoch_eval && !worker.finished()) {
      session.recoverable([&] { j->log_epoch(ps, std::size_t(next_epoch_eval / steps_per_epoch)); });
      next_epoch_eval += steps_per_epoch;
    }
  }
  session->close();
  worker.end();
  const double secs = std::chrono::duration<double>(job::clock::now() - t0).count();
  const std::int64_t steps_run = std::max<std::int64_t>(1, worker.global_step() - first_step);
  std::printf("%s: done at global step %lld; %llu contributions, %llu dropped; %.2f ms per global step\n",
              j->me().c_str(), static_cast<long long>(worker.global_step()),
              static_cast<unsigned long long>(d.contributions), static_cast<unsigned long long>(d.dropped),
              1e3 * secs / double(steps_run));
  std::fflush(stdout);
  char extra[160];
  std::snprintf(extra, sizeof extra, "step_ms=%.2f samples_per_s=%.0f contributions=%llu dropped=%llu",
                1e3 * secs / double(steps_run),
                double(steps_run) * double(j->batch) * double(worker.strategy().replicas_to_aggregate()) *
                    double(worker.strategy().steps_per_contribution()) / secs,
                static_cast<unsigned long long>(d.contributions), static_cast<unsigned long long>(d.dropped));
  if (standard_session::stopped_by_signal()) j->wait_for_workers = false;
  return session.recoverable([&] { return j->finish(ps, extra); });
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", scheme, e.what());
  return 2;
}

}  // namespace examples
