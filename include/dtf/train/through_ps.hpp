// dtf/train/through_ps.hpp — dtf::train's parameter-server roles: the ps task serving until
// the chief's shutdown, and a worker (or the chief) driving an asynchronous or synchronous
// strategy inside a monitored session (restore or initialise, checkpoints, recovery, the end of
// the job). See dtf/train.hpp for the whole picture.
//
// train_through_ps runs the phases of ps_job.hpp (connect, initialise or restore, resume the
// data position, finish) around the strategy's own, with what each guarantees on exit:
//   ps_trainer        (after connect) the strategy's worker exists over job.ps; the ps are not
//                     initialised yet.
//   session_start     what the session needs of the strategy (ps_start): the ps configuration,
//                     the initialisation from the seed, the restored values into the worker, the
//                     tables and buffers, the run's end and the checkpoint's positions checked.
//   run_sync          (run) the steps: synchronous to the job's last step, asynchronous through
//   run_async         --epochs of its shard (a stop or step limit ends either sooner); then the
//                     session's close (its final checkpoint), the worker's end and the task's done
//                     line. They return the RESULT line's own tokens (drops or staleness, also in
//                     the result).
//
// Restarts redo no work: every training task reports its data position (epoch, batch, examples
// trained) to ps 0 after each step (options.position_every; a synchronous worker right before
// its contribution, so a checkpoint of the step it completes holds it); the chief's checkpoints carry
// them, and a restore gives them back to a ps that lost them (dtf/ps/positions.hpp). A task
// (re)started into a running job reads its own position back and resumes its shard there; its
// epochs count the ones it had done. A position recorded for other data (shards, batch size,
// seed) is not used: the task says why and starts its shard over.
#pragma once

#include <dtf/cluster.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/ps.hpp>
#include <dtf/session.hpp>
#include <dtf/strategies/async.hpp>
#include <dtf/strategies/staleness_watch.hpp>
#include <dtf/strategies/sync.hpp>
#include <dtf/train/buffers.hpp>
#include <dtf/train/ps_job.hpp>
#include <dtf/train/report.hpp>
#include <dtf/train/resume.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtf::detail {

/// The driver of a parameter-server strategy's steps (only the one selected is instantiated).
template <class S, class M, bool Sync>
struct ps_worker_of {
  using type = strategies::async_worker<S, M>;
};
template <class S, class M>
struct ps_worker_of<S, M, true> {
  using type = strategies::sync_worker<S, M>;
};

/// The strategy's half of a training task: its worker (the strategy's driver), the chief's
/// evaluation of the centre variable θ̃, and what the session needs to initialise or restore
/// the ps. Constructed in place after the connection (the worker refers to job.ps and `net`).
template <class S, class M>
struct ps_trainer {
  static constexpr bool sync = S::kind == strategy_kind::synchronous;
  using model_type = M;
  using worker_type = typename ps_worker_of<S, M, sync>::type;

  ps_trainer(ps_job& job, M& net, const data::dataset& train_set, S strategy)
      : job(job), net(net), centre({num_parameters(job.vars)}), centre_host(num_parameters(job.vars)),
        evaluate(job.o.evaluate) {
    const train_options& o = job.o;
    if constexpr (sync) {
      epochs_last_step = std::int64_t(o.epochs) *
                         std::int64_t(train_set.shard(job.trainers, 0).batch(o.batch).batches_per_epoch() /
                                      strategy.steps_per_contribution());
      replicas = strategy.replicas_to_aggregate();
      worker.emplace(std::move(strategy), net, job.ps, job.trainer);
      if (o.compute_delay.count() > 0) worker->set_compute_delay(o.compute_delay);
    } else {
      worker.emplace(std::move(strategy), net, job.ps, job.trainer, job.trainers);
    }
    if (o.backward_passes_per_step != 1)
      throw error(errc::invalid_config, "train: backward_passes_per_step is for the collective strategies (a ps "
                                        "strategy's worker pushes every batch's gradient)");
    if (o.clip_norm > 0) w().set_clip_norm(o.clip_norm);  // each worker's own gradient
    if constexpr (embedding_model<M>) {
      if (o.embedding_rule) w().set_embedding_rule(*o.embedding_rule);
      if (o.evaluate_rows)
        evaluate = [&options = job.o, reader = strategies::detail::read_rows(w().tables())](std::span<const float> p) {
          return options.evaluate_rows(p, reader);
        };
    }
  }
  ps_trainer(const ps_trainer&) = delete;
  ps_trainer& operator=(const ps_trainer&) = delete;

  ps_job& job;
  M& net;
  tensor centre;  ///< the chief's copy of θ̃ to evaluate
  std::vector<float> centre_host;
  std::function<nn::evaluation(std::span<const float>)> evaluate;  ///< the rows' reader's for embedding models
  std::int64_t epochs_last_step = 0;  ///< synchronous: the global step that ends --epochs
  std::size_t replicas = 0;           ///< synchronous: contributions aggregated per step
  std::optional<worker_type> worker;

  worker_type& w() { return *worker; }
  /// The epochs an asynchronous task trains (resume.hpp); a synchronous one has no bound.
  std::optional<std::uint64_t> async_epochs() const {
    return sync ? std::nullopt : std::optional(std::uint64_t(job.o.epochs));
  }
  /// The chief's evaluation of θ̃ (nullopt without options.evaluate).
  std::optional<nn::evaluation> evaluate_centre() {
    if (!evaluate) return std::nullopt;
    job.ps.read_values(centre_host);  // not the chief's own pull: its DynSGD τ stays its own
    centre.copy_from_host<float>(centre_host);
    return evaluate(centre.span<float>());
  }
  /// The chief, at the end: the model takes θ̃ (adopts_parameters), then its evaluation.
  std::optional<nn::evaluation> final_centre() {
    if constexpr (adopts_parameters<M>) {
      job.ps.read_values(centre_host);
      centre.copy_from_host<float>(centre_host);
      net.set_parameters(centre.span<const float>());
    }
    return evaluate_centre();
  }
  void log_epoch(std::size_t epoch) {
    if (const auto e = evaluate_centre()) {
      std::printf("%s: epoch %zu  centre test_loss %.4f  test_accuracy %.4f\n", job.me.c_str(), epoch, e->loss,
                  e->accuracy);
      std::fflush(stdout);
    }
  }
  /// The chief's initialisation of the ps from the seed, said in a line.
  void init() {
    const train_options& o = job.o;
    if constexpr (sync)
      w().initialize_ps(o.seed, job.trainers);
    else
      w().initialize_ps(o.seed);
    if constexpr (sync)
      std::printf("%s: %s with %zu workers, %zu aggregated per step\n", job.me.c_str(), o.name.c_str(), job.trainers,
                  replicas);
    else
      std::printf("%s: %s with %zu workers; initialised %zu parameters on %zu ps\n", job.me.c_str(), o.name.c_str(),
                  job.trainers, num_parameters(job.vars), job.c.num_ps());
  }
  ps_start session_start(const data::dataset& train_set);
};

/// What start_ps_session needs of the strategy: the ps configuration, the initialisation, the
/// restored values into the worker, the tables and buffers, the run's end and position checks.
template <class S, class M>
ps_start ps_trainer<S, M>::session_start(const data::dataset& train_set) {
  const train_options& o = job.o;
  ps_start st;
  st.config = ps_config{.rule = w().strategy().ps_rule(), .replicas_to_aggregate = replicas, .num_workers = job.trainers};
  if constexpr (!sync) st.config.mode = w().strategy().lock_free() ? apply_mode::lock_free : apply_mode::locked;
  st.init = [this] { init(); };
  st.restored = [this](std::span<const float> v) { std::copy(v.begin(), v.end(), w().params().begin()); };
  // An embedding model's tables: saved with every checkpoint, restored with the dense variables.
  if constexpr (embedding_model<M>) {
    st.tables = &w().tables();
    st.create_tables = [this] { w().create_tables(); };
  }
  st.end = run_end{.last_step = o.last_step > 0 ? std::optional(o.last_step)
                         : sync && o.num_steps == 0 ? std::optional(epochs_last_step) : std::nullopt,
            .exact = sync, .num_steps = o.num_steps,
            .what = o.last_step > 0 ? "--last_step" : "--epochs " + std::to_string(o.epochs)};
  st.own_last = sync && o.last_step == 0 && o.num_steps == 0 ? std::optional(epochs_last_step) : std::nullopt;
  st.check = [this, &train_set](const checkpoint_manifest& man, const std::string& source) {
    check_positions(man.positions, train_set, job.trainers, job.o.batch, job.o.seed, async_epochs(), source);
  };
  if constexpr (has_buffers<M>)  // the chief's buffers come back with the checkpoint it restored
    st.restore_buffers = [&net = net, me = job.me](const std::string& dir, const std::string& name) {
      restore_buffers(net, dir, name, me);
    };
  st.save_buffers = [&net = net](const std::string& dir, const std::string& name) { save_buffers(net, dir, name); };
  if constexpr (has_buffers<M>)
    st.share_buffers = [this] { share_ps_buffers(job.ps, net, job.is_chief, std::chrono::milliseconds(job.o.timeout_ms)); };
  st.recovered = [this] { w().begin(); };
  return st;
}

/// Where the run is in this task's data: `at` after the batches trained, `started_at` where
/// this run began, `next` the position after the batch being trained (see run_ps_step).
struct ps_progress {
  data::position at, started_at, next;
  std::uint64_t batches_per_epoch = 0;  ///< of this task's shard
  double last_loss = 0;
};

/// Rows held and evicted per table, over all ps, when summaries are due.
inline void add_table_rows(const run_context& ctx, embedding_tables& tables, run_values& v) {
  if (!ctx.summaries_requested()) return;
  for (std::uint32_t t = 0; t < tables.size(); ++t) {
    const auto n = tables.rows(t);
    const std::string& name = tables.layout(t).spec.name;
    v.scalars["embedding/" + name + "/rows"] = double(n.held);
    v.scalars["embedding/" + name + "/evicted"] = double(n.evicted);
  }
}

/// One step of batch `b` in the session; add_scalars(v) adds the strategy's own scalars.
/// The position after the batch (p.next): a synchronous worker sends it with its contribution
/// and ps 0 records it with the step the contribution completes (a report after the step could
/// reach ps 0 after the chief's checkpoint of it, or, before the next contribution, during it);
/// an asynchronous worker, or one whose contribution was dropped, reports it after its step.
template <class T, class F>
void run_ps_step(T& t, ps_session& s, ps_progress& p, const data::host_batch& b, F&& add_scalars) {
  const train_options& o = t.job.o;
  auto& w = t.w();
  s.session->run([&](run_context& ctx) {
    run_values v;
    p.next = p.at;
    p.next.trained(b.epoch, b.index, b.labels.size(), p.batches_per_epoch);
    const bool due =
        o.position_every > 0 && (p.next.steps - p.started_at.steps) % std::uint64_t(o.position_every) == 0;
    bool recorded = false;
    if constexpr (T::sync) w.set_position(due ? &p.next : nullptr);
    v.loss = s.recoverable([&] { return w.step(b); });
    if constexpr (T::sync) recorded = w.position_committed();
    p.last_loss = *v.loss;
    p.at = p.next;
    if (due && !recorded) s.recoverable([&] { report_position(t.job.ps, p.at); });
    // A worker that has not heard from the ps yet reports 0: the session's step is newer.
    v.global_step = std::max(w.global_step(), ctx.global_step());
    v.examples = b.labels.size();
    add_scalars(v);
    if (o.learning_rate) v.scalars["learning_rate"] = o.learning_rate(*v.global_step, b.epoch);
    add_histograms(ctx, t.job.vars, w.params(), v);
    if constexpr (embedding_model<typename T::model_type>) add_table_rows(ctx, w.tables(), v);
    return v;
  });
}

/// Run, synchronous: steps to the job's last step (--last_step, --num_steps from the start, or
/// the steps of --epochs), the chief evaluating θ̃ after each epoch; then the session's close
/// (the final checkpoint) and the task's done line. Returns the RESULT line's own tokens.
template <class T>
std::string run_sync(T& t, ps_session& s, ps_progress& p, const data::dataset& my_shard, train_result& result) {
  const train_options& o = t.job.o;
  const std::string& me = t.job.me;
  auto& w = t.w();
  monitored_training_session& session = *s.session;
  // --num_steps counts from the step the session started at (after a restore).
  const std::int64_t last_step = o.last_step > 0   ? o.last_step
                                 : o.num_steps > 0 ? session.global_step() + o.num_steps
                                                   : t.epochs_last_step;
  w.set_last_step(last_step);
  std::printf("%s: training to global step %lld (from %lld)\n", me.c_str(), static_cast<long long>(last_step),
              static_cast<long long>(session.global_step()));
  std::fflush(stdout);
  w.begin();
  const auto train = my_shard.shuffle(o.seed + t.job.trainer).batch(o.batch).repeat(-1).prefetch(2);
  const auto& d = w.drops();
  const std::int64_t steps_per_epoch = std::max<std::int64_t>(1, t.epochs_last_step / std::max(1, o.epochs));
  std::int64_t next_epoch_eval = (session.global_step() / steps_per_epoch + 1) * steps_per_epoch;
  const std::int64_t first_step = session.global_step();
  auto stream = train.stream(p.at);
  const auto t0 = train_clock::now();
  while (!session.should_stop() && !w.finished()) {
    auto b = stream.next();
    run_ps_step(t, s, p, *b, [&](run_values& v) {
      v.scalars["contributions"] = double(d.contributions);
      v.scalars["dropped_gradients"] = double(d.dropped);
    });
    if (t.job.is_chief && w.global_step() >= next_epoch_eval && !w.finished()) {
      s.recoverable([&] { t.log_epoch(std::size_t(next_epoch_eval / steps_per_epoch)); });
      next_epoch_eval += steps_per_epoch;
    }
  }
  session.close();
  w.end();
  const double secs = std::chrono::duration<double>(train_clock::now() - t0).count();
  const std::int64_t steps_run = std::max<std::int64_t>(1, w.global_step() - first_step);
  std::printf("%s: done at global step %lld; %llu contributions, %llu dropped; %.2f ms per global step\n", me.c_str(),
              static_cast<long long>(w.global_step()), static_cast<unsigned long long>(d.contributions),
              static_cast<unsigned long long>(d.dropped), 1e3 * secs / double(steps_run));
  std::fflush(stdout);
  char buf[160];
  std::snprintf(buf, sizeof buf, "step_ms=%.2f samples_per_s=%.0f contributions=%llu dropped=%llu",
                1e3 * secs / double(steps_run),
                double(steps_run) * double(o.batch) * double(w.strategy().replicas_to_aggregate()) *
                    double(w.strategy().steps_per_contribution()) / secs,
                static_cast<unsigned long long>(d.contributions), static_cast<unsigned long long>(d.dropped));
  result.drops = d;
  return buf;
}

/// Run, asynchronous: --epochs of this task's shard from its position (a step limit or a stop
/// may end it sooner), the chief evaluating θ̃ after each epoch and warning once when its loss
/// rises while staleness grows; then the session's close (the final checkpoint) and the task's
/// done line. Returns the RESULT line's own tokens.
template <class T>
std::string run_async(T& t, ps_session& s, ps_progress& p, const data::dataset& my_shard, train_result& result) {
  const train_options& o = t.job.o;
  const std::string& me = t.job.me;
  auto& w = t.w();
  monitored_training_session& session = *s.session;
  if (t.job.is_chief && session.global_step() > 0)
    std::printf("%s: resumed from the checkpoint at global step %lld\n", me.c_str(),
                static_cast<long long>(session.global_step()));
  w.begin();
  const auto train = my_shard.shuffle(o.seed + t.job.trainer).batch(o.batch).repeat(o.epochs).prefetch(2);
  std::printf("%s: training on shard %zu of %zu (%zu examples), %d epochs\n", me.c_str(), t.job.trainer,
              t.job.trainers, train.size(), o.epochs);
  std::fflush(stdout);
  const auto& st = w.staleness();
  // The chief says once when its loss rises while staleness grows, naming what to change.
  std::optional<strategies::staleness_watch> watch;
  if (t.job.is_chief) watch.emplace(strategies::stability_setting_of(w.strategy()));
  // The epochs done before a restart count: the stream goes on from the position.
  auto stream = train.stream(p.at);
  while (!session.should_stop()) {
    auto b = stream.next();
    if (!b) break;
    run_ps_step(t, s, p, *b, [&](run_values& v) {
      v.scalars["staleness_mean"] = st.mean();
      v.scalars["staleness_max"] = double(st.max);
    });
    if (const auto why = watch ? watch->record(p.last_loss, st) : std::nullopt) {
      std::printf("%s: warning: %s\n", me.c_str(), why->c_str());
      std::fflush(stdout);
    }
    if (t.job.is_chief && b->index + 1 == train.batches_per_epoch())
      s.recoverable([&] { t.log_epoch(b->epoch + 1); });
  }
  session.close();
  w.end();
  std::printf("%s: done after %lld steps (%llu examples; %llu in all); %llu pushes, staleness mean %.2f max %llu\n",
              me.c_str(), static_cast<long long>(session.context().local_step()),
              static_cast<unsigned long long>(p.at.examples - p.started_at.examples),
              static_cast<unsigned long long>(p.at.examples), static_cast<unsigned long long>(st.pushes), st.mean(),
              static_cast<unsigned long long>(st.max));
  std::fflush(stdout);
  char buf[128];
  std::snprintf(buf, sizeof buf, "staleness_mean=%.2f staleness_max=%llu", st.mean(),
                static_cast<unsigned long long>(st.max));
  result.staleness = st;
  return buf;
}

/// A task of a parameter-server strategy (asynchronous or synchronous): the ps role, or a
/// worker (the chief among them) through the phases of ps_job.hpp around the strategy's run.
template <class S, class M, class P, class... Hooks>
train_result train_through_ps(const cluster& c, M& net, const data::dataset& train_set, S strategy,
                              const train_options& o, const P& partitioner, Hooks... user_hooks) {
  constexpr bool sync = S::kind == strategy_kind::synchronous;
  const auto started = train_clock::now();
  auto vars = net.variables();
  const transport_options transport = ps_transport(c, o);
  if (c.num_ps() == 0)
    throw error(errc::invalid_config, o.name + ": a parameter-server strategy needs ps tasks in the cluster");
  const placement layout = partitioner.place(vars, c.num_ps());
  if (c.self.job == "ps") {
    int threads = o.ps_threads;
    if constexpr (!sync)
      if (strategy.lock_free()) threads = std::max(threads, int(num_trainers(c)));
    return serve_ps(c, layout, transport, o, threads);
  }
  ps_job job(c, o, std::move(vars), layout, transport, started);  // connect
  ps_trainer<S, M> t(job, net, train_set, std::move(strategy));
  ps_session s{.start = t.session_start(train_set)};
  start_ps_session(job, s, std::move(user_hooks)...);  // initialise or restore
  const auto my_shard = train_set.shard(job.trainers, job.trainer);
  ps_progress p{.batches_per_epoch = my_shard.batch(o.batch).batches_per_epoch()};
  p.at = p.started_at = p.next = resume_position(job, s, my_shard, p.batches_per_epoch, t.async_epochs());
  train_result result;
  std::string extra;  // run
  if constexpr (sync)
    extra = run_sync(t, s, p, my_shard, result);
  else
    extra = run_async(t, s, p, my_shard, result);
  result.loss = p.last_loss;
  finish_ps_job(job, s, result, std::move(extra), [&] { return t.final_centre(); },
                [&] { return t.w().global_step(); });
  return result;
}
}  // namespace dtf::detail
