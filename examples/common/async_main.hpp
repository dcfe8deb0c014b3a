// The main() of every asynchronous-strategy example: the same binary runs as a parameter
// server or as a worker (the chief is worker 0 unless the cluster has a chief task); workers
// train the Fashion-MNIST MLP with strategy S on their shard of the data inside the standard
// monitored session (hooks.hpp: stop, checkpoints, NaN check, summaries, progress lines,
// SIGTERM/SIGINT); the chief evaluates the centre variable θ̃ after every epoch of its own and
// ends the job (see job.hpp). The RESULT line adds the staleness the chief's pushes saw.
#pragma once

#include <dtf/strategies/async.hpp>

#include "hooks.hpp"
#include "job.hpp"

namespace examples {

template <dtf::strategies::async_strategy S>
int async_main(int argc, char** argv, const char* scheme, const std::function<void(dtf::flag_parser&)>& add_flags,
               const std::function<S()>& make, job_defaults defaults = {}) try {
  hook_flags hf;
  auto j = job::setup(argc, argv, scheme, [&](dtf::flag_parser& f) {
    hf.add_to(f);
    add_flags(f);
  }, defaults);
  if (!j) return 0;
  if (j->is_ps()) return j->run_ps();
  hf.validate();
  const auto client = j->connect();
  auto& ps = *client;
  dtf::strategies::async_worker<S, dtf::nn::sequential> worker(make(), j->net, ps, j->trainer, j->trainers);
  standard_session session(*j, ps, hf, {
      .init = [&] {
        worker.initialize_ps(j->seed);
        std::printf("%s: %s with %zu workers; initialised %zu parameters on %zu ps\n", j->me().c_str(), scheme,
                    j->trainers, j->net.num_parameters(), j->cluster.num_ps());
      },
      .ps_rule = worker.strategy().ps_rule(),
      .lock_free = worker.strategy().lock_free(),
      .restored = [&](std::span<const float> v) { std::copy(v.begin(), v.end(), worker.params().begin()); },
      .after_recovery = [&] { worker.begin(); }});
  session->create();
  if (j->is_chief() && session->global_step() > 0)
    std::printf("%s: resumed from the checkpoint at global step %lld\n", j->me().c_str(),
                static_cast<long long>(session->global_step()));
  worker.begin();
  const auto train = j->train_shard(j->epochs);
  std::printf("%s: training on shard %zu of %zu (%zu examples), %d epochs\n", j->me().c_str(), j->trainer, j->trainers,
              train.size(), j->epochs);
  std::fflush(stdout);
  const auto& st = worker.staleness();
  const auto vars = j->net.variables();
  auto stream = train.stream();
  while (!session->should_stop()) {
    auto b = stream.next();
    if (!b) break;
    session->run([&](dtf::run_context& ctx) {
      dtf::run_values v;
      v.loss = session.recoverable([&] { return worker.step(*b); });
      // A worker that has not heard from the ps yet reports 0: the session's step is newer.
      v.global_step = std::max(worker.global_step(), ctx.global_step());
      v.examples = b->labels.size();
      v.scalars["staleness_mean"] = st.mean();
      v.scalars["staleness_max"] = double(st.max);
      if (defaults.learning_rate) v.scalars["learning_rate"] = defaults.learning_rate(*v.global_step, b->epoch);
      standard_session::add_variables(ctx, vars, worker.params(), v);
      return v;
    });
    if (j->is_chief() && b->index + 1 == train.batches_per_epoch())
      session.recoverable([&] { j->log_epoch(ps, b->epoch + 1); });
  }
  session->close();
  worker.end();
  std::printf("%s: done after %lld steps; %llu pushes, staleness mean %.2f max %llu\n", j->me().c_str(),
              static_cast<long long>(session->context().local_step()), static_cast<unsigned long long>(st.pushes),
              st.mean(), static_cast<unsigned long long>(st.max));
  std::fflush(stdout);
  char extra[128];
  std::snprintf(extra, sizeof extra, "staleness_mean=%.2f staleness_max=%llu", st.mean(),
                static_cast<unsigned long long>(st.max));
  if (standard_session::stopped_by_signal()) j->wait_for_workers = false;
  return session.recoverable([&] { return j->finish(ps, extra); });
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", scheme, e.what());
  return 2;
}

}  // namespace examples
