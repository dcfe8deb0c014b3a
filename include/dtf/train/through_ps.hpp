// dtf/train/through_ps.hpp — dtf::train's parameter-server roles: the ps task serving until
// the chief's shutdown, and a worker (or the chief) driving an asynchronous or synchronous
// strategy inside a monitored session (restore or initialise, checkpoints, recovery, the end of
// the job). See dtf/train.hpp for the whole picture.
//
// Restarts redo no work: every training task reports its data position (epoch, batch, examples
// trained) to ps 0 after each step (options.position_every; a synchronous worker right before
// its contribution, so a checkpoint of the step it completes holds it); the chief's checkpoints carry
// them, and a restore gives them back to a ps that lost them (dtf/ps/positions.hpp). A task
// (re)started into a running job reads its own position back and resumes its shard there; its
// epochs count the ones it had done. A position recorded for other data (shards, batch size,
// seed) is not used: the task says why and starts its shard over.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/train/buffers.hpp>
#include <dtf/cluster.hpp>
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/hooks/stop_on_signal.hpp>
#include <dtf/ps.hpp>
#include <dtf/ps/positions.hpp>
#include <dtf/recovery.hpp>
#include <dtf/session.hpp>
#include <dtf/strategies/async.hpp>
#include <dtf/strategies/staleness_watch.hpp>
#include <dtf/strategies/sync.hpp>
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
#include <vector>

namespace dtf::detail {

/// The ps role: serve until the chief's shutdown.
/// threads: its I/O threads (lock-free strategies get one per trainer at least, so updates
/// from different workers are applied concurrently, as Hogwild means).
inline train_result serve_ps(const cluster& c, const placement& layout, const transport_options& t,
                             const train_options& o, int threads) {
  const auto t0 = train_clock::now();
  const std::string me = c.self.str();
  ps_options po{t, threads};
  // The ps writes and reads checkpoints only here (never in a directory a peer names).
  po.checkpoint_dir = o.model_dir;
  for (const char* job : {"chief", "worker"})
    for (const auto& task : c.spec.tasks(job)) po.known_workers.push_back(task.str());
  po.chief = c.chief().str();  // init, restore, save and shutdown are the chief's alone
  // Handshake slots for the cluster's own hosts, which strangers' connections cannot take.
  for (const auto& [job, tasks] : c.spec.jobs)
    for (const auto& [index, address] : tasks) po.transport.cluster_hosts.push_back(address);
  parameter_server ps(c.spec.address(c.self), std::move(po));
  std::printf("%s: serving %zu shards (%zu bytes) for %s\n", me.c_str(), layout.shards_on(c.self.index).size(),
              layout.bytes_on(c.self.index), o.name.c_str());
  std::fflush(stdout);
  ps.run();
  std::printf("%s: shut down by the chief at global step %lld; exiting\n", me.c_str(),
              static_cast<long long>(ps.global_step()));
  std::fflush(stdout);
  train_result r;
  r.global_step = ps.global_step();
  r.wall_s = std::chrono::duration<double>(train_clock::now() - t0).count();
  return r;
}

/// The driver of a parameter-server strategy's steps (only the one selected is instantiated).
template <class S, class M, bool Sync>
struct ps_worker_of {
  using type = strategies::async_worker<S, M>;
};
template <class S, class M>
struct ps_worker_of<S, M, true> {
  using type = strategies::sync_worker<S, M>;
};

/// A worker of a parameter-server strategy (asynchronous or synchronous).
template <class S, class M, class P, class... Hooks>
train_result train_through_ps(const cluster& c, M& net, const data::dataset& train_set, S strategy,
                              const train_options& o, const P& partitioner, Hooks... user_hooks) {
  constexpr bool sync = S::kind == strategy_kind::synchronous;
  const auto started = train_clock::now();
  const std::string me = c.self.str();
  const auto vars = net.variables();
  transport_options transport;
  transport.cluster_id = c.id();
  transport.identity = me;
  transport.secret = o.secret;
  transport.task_key = o.task_key;
  transport.tls = o.tls;
  transport.timeout_ms = o.timeout_ms;
  if (c.num_ps() == 0)
    throw error(errc::invalid_config, o.name + ": a parameter-server strategy needs ps tasks in the cluster");
  const placement layout = partitioner.place(vars, c.num_ps());
  if (c.self.job == "ps") {
    if (o.secret.empty() && !o.task_key.empty())
      throw error(errc::invalid_config, o.name + ": " + me + " holds only a task key; a ps needs the master secret "
                                        "($DTF_CLUSTER_SECRET or --secret_file) to authenticate its peers");
    int threads = o.ps_threads;
    if constexpr (!sync)
      if (strategy.lock_free()) threads = std::max(threads, int(num_trainers(c)));
    return serve_ps(c, layout, transport, o, threads);
  }
  if (c.self.job != "worker" && c.self.job != "chief")
    throw error(errc::invalid_config, o.name + " runs as ps, worker or chief, not " + c.self.job);
  const std::size_t trainers = num_trainers(c), trainer = trainer_index(c);
  const bool is_chief = c.is_chief();

  std::vector<std::string> addresses;
  for (const auto& t : c.spec.tasks("ps")) addresses.push_back(c.spec.address(t));
  ps_client ps(addresses, layout, transport);
  ps.connect();

  // Evaluation of the centre variable θ̃ (chief).
  tensor centre({num_parameters(vars)});
  std::vector<float> centre_host(num_parameters(vars));
  std::function<nn::evaluation(std::span<const float>)> evaluate = o.evaluate;  // set below for embedding models
  auto evaluate_centre = [&]() -> std::optional<nn::evaluation> {
    if (!evaluate) return std::nullopt;
    ps.read_values(centre_host);  // not the chief's own pull: its DynSGD τ stays its own
    centre.copy_from_host<float>(centre_host);
    return evaluate(centre.span<float>());
  };
  auto log_epoch = [&](std::size_t epoch) {
    if (const auto e = evaluate_centre()) {
      std::printf("%s: epoch %zu  centre test_loss %.4f  test_accuracy %.4f\n", me.c_str(), epoch, e->loss, e->accuracy);
      std::fflush(stdout);
    }
  };

  const auto shard_of = [&](std::size_t k) { return train_set.shard(trainers, k); };
  std::int64_t epochs_last_step = 0;
  std::size_t replicas = 0;
  using worker_type = typename ps_worker_of<S, M, sync>::type;
  std::optional<worker_type> worker;
  if constexpr (sync) {
    epochs_last_step = std::int64_t(o.epochs) *
                       std::int64_t(shard_of(0).batch(o.batch).batches_per_epoch() / strategy.steps_per_contribution());
    replicas = strategy.replicas_to_aggregate();
    worker.emplace(std::move(strategy), net, ps, trainer);
    if (o.compute_delay.count() > 0) worker->set_compute_delay(o.compute_delay);
  } else {
    worker.emplace(std::move(strategy), net, ps, trainer, trainers);
  }
  auto& w = *worker;
  if constexpr (embedding_model<M>) {
    if (o.embedding_rule) w.set_embedding_rule(*o.embedding_rule);
    if (o.evaluate_rows)
      evaluate = [&, reader = strategies::detail::read_rows(w.tables())](std::span<const float> p) {
        return o.evaluate_rows(p, reader);
      };
  }
  // An embedding model's tables: saved with every checkpoint, restored with the dense variables.
  embedding_tables* tables = nullptr;
  if constexpr (embedding_model<M>) tables = &w.tables();
  ps_config config{.rule = w.strategy().ps_rule(), .replicas_to_aggregate = replicas, .num_workers = trainers};
  if constexpr (!sync) config.mode = w.strategy().lock_free() ? apply_mode::lock_free : apply_mode::locked;
  auto init = [&] {
    if constexpr (sync)
      w.initialize_ps(o.seed, trainers);
    else
      w.initialize_ps(o.seed);
    if constexpr (sync)
      std::printf("%s: %s with %zu workers, %zu aggregated per step\n", me.c_str(), o.name.c_str(), trainers, replicas);
    else
      std::printf("%s: %s with %zu workers; initialised %zu parameters on %zu ps\n", me.c_str(), o.name.c_str(),
                  trainers, num_parameters(vars), c.num_ps());
  };

  // The chief refuses a checkpoint whose step or positions this configuration never reaches
  // (dtf/train/resume.hpp), before the ps tasks get any of it; every task checks its start.
  const run_end end{.last_step = o.last_step > 0 ? std::optional(o.last_step)
                                 : sync && o.num_steps == 0 ? std::optional(epochs_last_step) : std::nullopt,
                    .exact = sync, .num_steps = o.num_steps,
                    .what = o.last_step > 0 ? "--last_step" : "--epochs " + std::to_string(o.epochs)};
  const auto async_epochs = sync ? std::nullopt : std::optional(std::uint64_t(o.epochs));
  std::string restored;  // "checkpoint NAME of DIR", once the chief restores one
  session_scaffold scaffold = ps_scaffold(ps, {.checkpoint_dir = o.model_dir,
                                              .variables = vars,
                                              .config = config,
                                              .init = init,
                                              .ready_timeout = std::chrono::milliseconds(o.timeout_ms),
                                              .restored = [&](std::span<const float> v) {
                                                std::copy(v.begin(), v.end(), w.params().begin());
                                              },
                                              .tables = tables,
                                              .check = [&](const checkpoint_manifest& man) {
                                                restored = "checkpoint " + man.name + " of " + o.model_dir;
                                                (void)check_start_step(man.global_step, end, restored);
                                                check_positions(man.positions, train_set, trainers, o.batch, o.seed,
                                                                async_epochs, restored);
                                              }});
  if constexpr (has_buffers<M>)  // the chief's buffers come back with the checkpoint it restored
    scaffold.restore = [restore = scaffold.restore, &net, dir = o.model_dir, me]() -> std::optional<std::int64_t> {
      const auto step = restore();
      if (step) restore_buffers(net, dir, "ckpt-" + std::to_string(*step), me);
      return step;
    };
  monitored_training_session session({.is_chief = is_chief, .scaffold = std::move(scaffold)});
  hooks::stop_on_signal signals(session);
  std::optional<ps_recovery> recovery;
  if (o.max_recoveries > 0) {
    // The chief re-initialises a ps that came back empty: every ps from the latest checkpoint,
    // or from scratch when there is none.
    auto reinitialise = [&] {
      if (o.model_dir.empty() || !restore_latest(ps, o.model_dir, vars, config, {}, checkpoint_fallback::newest_valid,
                                                 restore_transfer::through_chief, tables)) {
        std::fprintf(stderr, "%s: no checkpoint to restore the parameter servers from; initialising afresh\n",
                     me.c_str());
        init();
      }
    };
    recovery.emplace(ps, is_chief, reinitialise,
                     recovery_options{.max_recoveries = o.max_recoveries,
                                      .ready_timeout = std::chrono::milliseconds(o.timeout_ms)},
                     [&] { w.begin(); });
  }
  auto recoverable = [&](auto&& f) -> decltype(auto) {
    if (recovery) return recovery->run(f);
    return f();
  };
  const std::optional<std::int64_t> own_last =
      sync && o.last_step == 0 && o.num_steps == 0 ? std::optional(epochs_last_step) : std::nullopt;
  auto writer = add_standard_hooks(session, o, own_last, me, is_chief);
  if (!o.model_dir.empty()) {
    const checkpoint_options ck{.directory = o.model_dir, .max_to_keep = std::size_t(o.keep_checkpoints)};
    session.add_chief_hook(hooks::checkpoint_saver(
        [&, ck](std::int64_t step) -> checkpoint_manifest {
          save_buffers(net, ck.directory, ck.prefix + "-" + std::to_string(step));  // before the manifest
          return recoverable([&] { return save_checkpoint(ps, ck, vars, step); });
        },
        {.every_n_steps = o.save_checkpoints_steps, .every_secs = o.save_checkpoints_secs}));
  }
  (session.add_hook(std::move(user_hooks)), ...);
  // The tables exist before the session restores or initialises (a restore fills them).
  if constexpr (embedding_model<M>)
    if (is_chief) recoverable([&] { w.create_tables(); });
  session.create();
  // A start at or past the end says so; one beyond what this configuration reaches is an error.
  if (const auto line = check_start_step(session.global_step(), end,
                                         restored.empty() ? "on the parameter servers" : restored); !line.empty()) {
    std::printf("%s: %s\n", me.c_str(), line.c_str());
    std::fflush(stdout);
  }

  // Where this task is in its data: its recorded position when it has one (a restarted task,
  // or a job resumed from a checkpoint that carries positions), else the start of its shard.
  const auto my_shard = shard_of(trainer);
  const std::uint64_t batches_per_epoch = my_shard.batch(o.batch).batches_per_epoch();
  data::position at = data::position::start_of(trainers, my_shard.size(), o.batch, o.seed + trainer);
  if (o.position_every > 0) {
    if (const auto recorded = recoverable([&] { return recorded_position(ps); })) {
      if (const auto why = recorded->unusable_in(at, batches_per_epoch)) {
        std::fprintf(stderr, "%s: not resuming the data position recorded for this task (%s); starting its shard over\n",
                     me.c_str(), why->c_str());
      } else {
        at = *recorded;
        const bool finished = check_position(at, batches_per_epoch, async_epochs, me, "the position ps 0 holds");
        std::printf("%s: resuming its shard at epoch %llu, batch %llu (%llu examples in %llu steps trained before)\n",
                    me.c_str(), static_cast<unsigned long long>(at.epoch), static_cast<unsigned long long>(at.batch),
                    static_cast<unsigned long long>(at.examples), static_cast<unsigned long long>(at.steps));
        if (finished)
          std::printf("%s: that is the end of its %d epochs: training already finished, nothing to train\n", me.c_str(),
                      o.epochs);
        std::fflush(stdout);
      }
    }
  }
  const data::position started_at = at;

  train_result result;
  double last_loss = 0;
  // The position after the batch being trained. A synchronous worker sends it with its
  // contribution and ps 0 records it with the step the contribution completes (a report after
  // the step could reach ps 0 after the chief's checkpoint of it, or, before the next
  // contribution, during it); an asynchronous worker, or one whose contribution was dropped,
  // reports it after its step.
  data::position next = at;
  auto run_step = [&](const data::host_batch& b, auto&& add_scalars) {
    session.run([&](run_context& ctx) {
      run_values v;
      next = at;
      next.trained(b.epoch, b.index, b.labels.size(), batches_per_epoch);
      const bool due =
          o.position_every > 0 && (next.steps - started_at.steps) % std::uint64_t(o.position_every) == 0;
      bool recorded = false;
      if constexpr (sync) w.set_position(due ? &next : nullptr);
      v.loss = recoverable([&] { return w.step(b); });
      if constexpr (sync) recorded = w.position_committed();
      last_loss = *v.loss;
      at = next;
      if (due && !recorded) recoverable([&] { report_position(ps, at); });
      // A worker that has not heard from the ps yet reports 0: the session's step is newer.
      v.global_step = std::max(w.global_step(), ctx.global_step());
      v.examples = b.labels.size();
      add_scalars(v);
      if (o.learning_rate) v.scalars["learning_rate"] = o.learning_rate(*v.global_step, b.epoch);
      add_histograms(ctx, vars, w.params(), v);
      if constexpr (embedding_model<M>)
        if (ctx.summaries_requested())  // rows held and evicted per table, over all ps
          for (std::uint32_t t = 0; t < w.tables().size(); ++t) {
            const auto n = w.tables().rows(t);
            const std::string& name = w.tables().layout(t).spec.name;
            v.scalars["embedding/" + name + "/rows"] = double(n.held);
            v.scalars["embedding/" + name + "/evicted"] = double(n.evicted);
          }
      return v;
    });
  };

  std::string extra;
  if constexpr (sync) {
    // --num_steps counts from the step the session started at (after a restore).
    const std::int64_t last_step = o.last_step > 0   ? o.last_step
                                   : o.num_steps > 0 ? session.global_step() + o.num_steps
                                                     : epochs_last_step;
    w.set_last_step(last_step);
    std::printf("%s: training to global step %lld (from %lld)\n", me.c_str(), static_cast<long long>(last_step),
                static_cast<long long>(session.global_step()));
    std::fflush(stdout);
    w.begin();
    const auto train = my_shard.shuffle(o.seed + trainer).batch(o.batch).repeat(-1).prefetch(2);
    const auto& d = w.drops();
    const std::int64_t steps_per_epoch = std::max<std::int64_t>(1, epochs_last_step / std::max(1, o.epochs));
    std::int64_t next_epoch_eval = (session.global_step() / steps_per_epoch + 1) * steps_per_epoch;
    const std::int64_t first_step = session.global_step();
    auto stream = train.stream(at);
    const auto t0 = train_clock::now();
    while (!session.should_stop() && !w.finished()) {
      auto b = stream.next();
      run_step(*b, [&](run_values& v) {
        v.scalars["contributions"] = double(d.contributions);
        v.scalars["dropped_gradients"] = double(d.dropped);
      });
      if (is_chief && w.global_step() >= next_epoch_eval && !w.finished()) {
        recoverable([&] { log_epoch(std::size_t(next_epoch_eval / steps_per_epoch)); });
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
    extra = buf;
    result.drops = d;
  } else {
    if (is_chief && session.global_step() > 0)
      std::printf("%s: resumed from the checkpoint at global step %lld\n", me.c_str(),
                  static_cast<long long>(session.global_step()));
    w.begin();
    const auto train = my_shard.shuffle(o.seed + trainer).batch(o.batch).repeat(o.epochs).prefetch(2);
    std::printf("%s: training on shard %zu of %zu (%zu examples), %d epochs\n", me.c_str(), trainer, trainers,
                train.size(), o.epochs);
    std::fflush(stdout);
    const auto& st = w.staleness();
    // The chief says once when its loss rises while staleness grows, naming what to change.
    std::optional<strategies::staleness_watch> watch;
    if (is_chief) watch.emplace(strategies::stability_setting_of(w.strategy()));
    // The epochs done before a restart count: the stream goes on from the position.
    auto stream = train.stream(at);
    while (!session.should_stop()) {
      auto b = stream.next();
      if (!b) break;
      run_step(*b, [&](run_values& v) {
        v.scalars["staleness_mean"] = st.mean();
        v.scalars["staleness_max"] = double(st.max);
      });
      if (const auto why = watch ? watch->record(last_loss, st) : std::nullopt) {
        std::printf("%s: warning: %s\n", me.c_str(), why->c_str());
        std::fflush(stdout);
      }
      if (is_chief && b->index + 1 == train.batches_per_epoch()) recoverable([&] { log_epoch(b->epoch + 1); });
    }
    session.close();
    w.end();
    std::printf("%s: done after %lld steps (%llu examples; %llu in all); %llu pushes, staleness mean %.2f max %llu\n",
                me.c_str(), static_cast<long long>(session.context().local_step()),
                static_cast<unsigned long long>(at.examples - started_at.examples),
                static_cast<unsigned long long>(at.examples), static_cast<unsigned long long>(st.pushes), st.mean(),
                static_cast<unsigned long long>(st.max));
    std::fflush(stdout);
    char buf[128];
    std::snprintf(buf, sizeof buf, "staleness_mean=%.2f staleness_max=%llu", st.mean(),
                  static_cast<unsigned long long>(st.max));
    extra = buf;
    result.staleness = st;
  }
  if (!o.result_extra.empty()) extra = o.result_extra + " " + extra;
  result.stopped_by_signal = hooks::stop_on_signal::stopped_by_signal();
  result.loss = last_loss;
  // The end of the job: report done; the chief waits for every worker (not after a stop
  // request: the job ends now, and tasks still training lose their parameter servers),
  // evaluates, prints the RESULT line and shuts the parameter servers down.
  result.exit_code = recoverable([&] {
    ps.mark_done();
    result.global_step = w.global_step();
    if (!is_chief) return 0;
    if (!result.stopped_by_signal && ps.wait_workers_done(trainers, std::chrono::seconds(o.finish_timeout_s)) < trainers)
      throw error(errc::timeout, "workers did not finish within " + std::to_string(o.finish_timeout_s) + " s");
    result.evaluation = evaluate_centre();
    result.global_step = ps.global_step();
    const double wall = std::chrono::duration<double>(train_clock::now() - started).count();
    if (result.evaluation) {
      std::printf("%s: final test accuracy %.4f  test_loss %.4f  global_step %lld  wall %.1fs\n", me.c_str(),
                  result.evaluation->accuracy, result.evaluation->loss, static_cast<long long>(result.global_step),
                  wall);
      std::printf("RESULT scheme=%s workers=%zu accuracy=%.4f wall_s=%.1f %s\n", o.name.c_str(), trainers,
                  result.evaluation->accuracy, wall, extra.c_str());
    } else {
      std::printf("RESULT scheme=%s workers=%zu wall_s=%.1f %s\n", o.name.c_str(), trainers, wall, extra.c_str());
    }
    std::fflush(stdout);
    ps.shutdown();
    std::printf("%s: parameter servers shut down\n", me.c_str());
    std::fflush(stdout);
    const auto& e = result.evaluation;
    if (!o.metrics_file.empty())
      write_metrics_file(o.metrics_file, e ? e->accuracy : 0.0, e ? e->loss : 0.0, result.global_step, wall, trainers);
    if (o.target_accuracy > 0 && (e ? e->accuracy : 0.0) < o.target_accuracy) {
      std::fprintf(stderr, "%s: test accuracy %.4f is below the target %.4f\n", me.c_str(), e ? e->accuracy : 0.0,
                   o.target_accuracy);
      return 1;
    }
    return 0;
  });
  result.recoveries = recovery ? recovery->recoveries() : 0;
  result.wall_s = std::chrono::duration<double>(train_clock::now() - started).count();
  return result;
}
}  // namespace dtf::detail
