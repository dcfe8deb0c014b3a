// dtf/train.hpp — dtf::train: runs this task's part of a training job, whatever its role.
//
//   int main(int argc, char** argv) {
//     dtf::cluster cluster = dtf::resolve_cluster(cluster_flags);
//     my_model net;                                           // anything modelling dtf::model
//     auto data = dtf::data::load_fashion_mnist(dtf::data::split::train).normalize();
//     auto r = dtf::train(cluster, net, data, dtf::strategies::hogwild({}), {.name = "hogwild", .epochs = 5});
//     return r.exit_code;
//   }
//
// The same call runs on every task (the strategy's kind decides the shape, dtf/concepts.hpp):
//   ps task          serves its shards (dtf::parameter_server) until the chief ends the job,
//                    then returns exit code 0. Collective strategies have no ps tasks.
//   chief            (chief.0, or worker.0 without a chief job; rank 0 for collectives)
//                    restores the latest checkpoint in model_dir when there is one, else
//                    initialises the variables from `seed`; saves checkpoints at the start, every
//                    save_checkpoints_steps / save_checkpoints_secs and at the end; writes
//                    summaries; evaluates (options.evaluate) after each of its epochs and at the
//                    end; prints the RESULT line; ends the job (ps: waits for every worker's
//                    done, then shuts the ps tasks down; collective: every rank leaves together).
//   worker / rank    trains its shard of `data` (shard k of the training tasks, shuffled with
//                    seed + k, batched, prefetched) inside a monitored session with the standard
//                    hooks: stop at last_step / after num_steps (or after `epochs`), the NaN
//                    check (nan_policy), progress lines with dtfrun's key=value tokens, and the
//                    caller's own hooks.
// SIGTERM / SIGINT: the first one stops cleanly — the step in progress completes, the chief
// checkpoints and ends the job; collective ranks agree on the stop first (hooks/agreed_stop.hpp).
// A lost ps: with max_recoveries > 0 the step, save or end is retried after the ps comes back
// (dtf/recovery.hpp; the chief re-initialises it from the latest checkpoint).
//
// The RESULT line (chief) is machine-readable for benchmarks/:
//   RESULT scheme=<name> workers=<n> accuracy=<a> wall_s=<s> <kind-specific key=value ...>
// The partitioner (ps strategies) and the caller's own hooks are policy types chosen in the
// same call: train(cluster, net, data, strategy, options, partitioner, hook1, hook2, ...).
//
// Errors: a bad option is dtf::error(errc::invalid_config) naming it; errors of the transport,
// the ps, the communicator and the checkpoints propagate (as exceptions) from this task.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/cluster.hpp>
#include <dtf/collectives.hpp>
#include <dtf/concepts.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/hooks/agreed_stop.hpp>
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/hooks/collective_restore.hpp>
#include <dtf/hooks/logging.hpp>
#include <dtf/hooks/nan_tensor.hpp>
#include <dtf/hooks/step_counter.hpp>
#include <dtf/hooks/stop_at_step.hpp>
#include <dtf/hooks/stop_on_signal.hpp>
#include <dtf/hooks/summary_saver.hpp>
#include <dtf/nn/evaluate.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>
#include <dtf/recovery.hpp>
#include <dtf/runtime.hpp>
#include <dtf/session.hpp>
#include <dtf/strategies/async.hpp>
#include <dtf/strategies/sync.hpp>
#include <dtf/summary.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace dtf {

/// What dtf::train does besides the strategy's steps. Units in the names; 0 turns a cadence off.
struct train_options {
  std::string name = "dtf";  ///< the scheme in RESULT lines and messages
  int epochs = 5;            ///< passes over each training task's shard (the job's end unless a step limit is set)
  std::int64_t last_step = 0;  ///< stop at this global step (0: after `epochs`)
  std::int64_t num_steps = 0;  ///< stop after this many more global steps (0: after `epochs`)
  std::size_t batch = 64;      ///< examples per local step (per replica for mirrored)
  std::uint64_t seed = 42;     ///< initialisation; shard k shuffles with seed + k
  std::string model_dir;       ///< checkpoints and event files; resumes from its latest checkpoint (empty: neither)
  std::int64_t save_checkpoints_steps = 0;  ///< chief: a checkpoint every N global steps
  double save_checkpoints_secs = 600;       ///< chief: a checkpoint every S seconds
  int keep_checkpoints = 5;                 ///< max_to_keep (0: all)
  int summary_every = 100;                  ///< chief: summaries every N global steps (0: none)
  hooks::nan_policy nan_policy = hooks::nan_policy::fail;
  int max_recoveries = 0;   ///< ps strategies: carry on after a lost ps up to N times (0: fail)
  int log_every = 200;      ///< local steps between progress lines
  std::string secret;       ///< cluster secret (empty: no authentication; train_flags reads $DTF_CLUSTER_SECRET)
  std::uint32_t timeout_ms = 60000;  ///< a ps request's deadline; a collective's longest wait without progress
  int finish_timeout_s = 1800;       ///< chief: how long to wait for the other workers to finish
  int ps_threads = 1;                ///< I/O threads of a ps task
  std::size_t segment_bytes = 256 * 1024;  ///< collective: allreduce segment size
  /// Test loss and accuracy of parameters (device memory, the model's layout); called by the
  /// chief after each of its epochs and at the end. Empty: no evaluation (RESULT has no accuracy).
  std::function<nn::evaluation(std::span<const float> params)> evaluate;
  /// The same for an embedding model (dtf/embedding_model.hpp): dense parameters and a reader
  /// of the tables' rows on the ps (e.g. dtf::evaluate_on(net, test) of an embedding classifier).
  std::function<nn::evaluation(std::span<const float> params, const row_reader& rows)> evaluate_rows;
  /// Embedding models: the rule the ps applies to the tables' row gradients (none: the
  /// strategy's ps rule).
  std::optional<optim::rule> embedding_rule;
  /// The learning rate at a global step in an epoch, reported as "learning_rate" (empty: none;
  /// collective strategies report their own).
  std::function<double(std::int64_t global_step, std::size_t epoch)> learning_rate;
  /// Synchronous strategies: this task's gradients take this much longer (a straggler, for benchmarks).
  std::chrono::milliseconds compute_delay{0};
  std::string metrics_file;   ///< chief: the final figures as JSON, written atomically (empty: none)
  double target_accuracy = 0;  ///< chief: exit code 1 when the final accuracy is lower
  std::string result_extra;    ///< extra key=value tokens for the RESULT line
};

/// What a task's train() returns.
struct train_result {
  int exit_code = 0;             ///< 0, or 1 below target_accuracy; a ps task: 0 after the chief's shutdown
  std::int64_t global_step = 0;  ///< the last global step this task saw
  double loss = 0;               ///< this task's last training loss
  std::optional<nn::evaluation> evaluation;  ///< chief: the final test metrics (with options.evaluate)
  double wall_s = 0;             ///< from train()'s start to its end
  strategies::staleness_stats staleness;  ///< asynchronous: this worker's pushes
  strategies::drop_stats drops;           ///< synchronous: this worker's contributions and dropped ones
  bool stopped_by_signal = false;
  int recoveries = 0;            ///< lost-ps recoveries this task went through
};

/// A cluster of this process alone (collective strategies: one rank; no ps).
inline cluster local_cluster() {
  cluster c;
  c.self = {"worker", 0};
  c.source = "local";
  return c;
}

/// The training tasks of a cluster (chief and workers) and this task's index among them
/// (the chief is 0).
inline std::size_t num_trainers(const cluster& c) {
  return c.num_workers() + (c.spec.num_tasks("chief") > 0 ? 1 : 0);
}
inline std::size_t trainer_index(const cluster& c) {
  const bool has_chief_job = c.spec.num_tasks("chief") > 0;
  return c.self.job == "chief" ? 0 : c.self.index + (has_chief_job ? 1 : 0);
}

/// An evaluation callback for options.evaluate: nn::evaluate of `m` over `test`.
template <classifier M>
std::function<nn::evaluation(std::span<const float>)> evaluate_on(M& m, data::dataset test) {
  return [&m, test = std::move(test)](std::span<const float> p) { return nn::evaluate(m, p, test); };
}
/// The same for an embedding classifier, for options.evaluate_rows.
template <embedding_classifier M>
std::function<nn::evaluation(std::span<const float>, const row_reader&)> evaluate_on(M& m, data::dataset test) {
  return [&m, test = std::move(test)](std::span<const float> p, const row_reader& rows) {
    return nn::evaluate(m, p, rows, test);
  };
}

namespace detail {

using train_clock = std::chrono::steady_clock;

inline void validate(const train_options& o) {
  auto bad = [](const std::string& what, const std::string& why) {
    throw error(errc::invalid_config, "train: " + what + ": " + why);
  };
  if (o.epochs < 0) bad("epochs", "must not be negative");
  if (o.batch == 0) bad("batch", "must be positive");
  if (o.last_step < 0) bad("last_step", "must not be negative");
  if (o.num_steps < 0) bad("num_steps", "must not be negative");
  if (o.last_step > 0 && o.num_steps > 0) bad("num_steps", "give last_step or num_steps, not both");
  if (o.save_checkpoints_steps < 0) bad("save_checkpoints_steps", "must not be negative");
  if (o.save_checkpoints_secs < 0) bad("save_checkpoints_secs", "must not be negative");
  if (o.keep_checkpoints < 0) bad("keep_checkpoints", "must not be negative");
  if (o.summary_every < 0) bad("summary_every", "must not be negative");
  if (o.max_recoveries < 0) bad("max_recoveries", "must not be negative");
  if (o.log_every < 0) bad("log_every", "must not be negative");
}

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

/// The chief's final report: evaluation line, RESULT line, metrics file; returns the exit code.
inline int report_result(const train_options& o, const std::string& me, std::size_t workers,
                         const std::optional<nn::evaluation>& e, std::int64_t global_step, double wall,
                         const std::string& before_accuracy, const std::string& after) {
  if (e) {
    std::printf("%s: final test accuracy %.4f  test_loss %.4f  global_step %lld  wall %.1fs\n", me.c_str(),
                e->accuracy, e->loss, static_cast<long long>(global_step), wall);
    std::printf("RESULT scheme=%s workers=%zu %saccuracy=%.4f wall_s=%.1f %s\n", o.name.c_str(), workers,
                before_accuracy.c_str(), e->accuracy, wall, after.c_str());
  } else {
    std::printf("%s: done at global step %lld  wall %.1fs\n", me.c_str(), static_cast<long long>(global_step), wall);
    std::printf("RESULT scheme=%s workers=%zu %swall_s=%.1f %s\n", o.name.c_str(), workers, before_accuracy.c_str(),
                wall, after.c_str());
  }
  std::fflush(stdout);
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
  transport.timeout_ms = o.timeout_ms;
  if (c.num_ps() == 0)
    throw error(errc::invalid_config, o.name + ": a parameter-server strategy needs ps tasks in the cluster");
  const placement layout = partitioner.place(vars, c.num_ps());
  if (c.self.job == "ps") {
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
    // Checkpoints and recovery hold the dense variables only: a restore would lose the tables.
    if (!o.model_dir.empty())
      throw error(errc::invalid_config, o.name + ": model_dir: checkpoints of embedding tables are not supported yet");
    if (o.max_recoveries > 0)
      throw error(errc::invalid_config, o.name + ": max_recoveries: a lost ps would lose its embedding rows");
    if (o.embedding_rule) w.set_embedding_rule(*o.embedding_rule);
    if (o.evaluate_rows)
      evaluate = [&, reader = strategies::detail::read_rows(w.tables())](std::span<const float> p) {
        return o.evaluate_rows(p, reader);
      };
  }
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

  monitored_training_session session(
      {.is_chief = is_chief,
       .scaffold = ps_scaffold(ps, {.checkpoint_dir = o.model_dir,
                                    .variables = vars,
                                    .config = config,
                                    .init = init,
                                    .ready_timeout = std::chrono::milliseconds(o.timeout_ms),
                                    .restored = [&](std::span<const float> v) {
                                      std::copy(v.begin(), v.end(), w.params().begin());
                                    }})});
  hooks::stop_on_signal signals(session);
  std::optional<ps_recovery> recovery;
  if (o.max_recoveries > 0) {
    // The chief re-initialises a ps that came back empty: every ps from the latest checkpoint,
    // or from scratch when there is none.
    auto reinitialise = [&] {
      if (o.model_dir.empty() || !restore_latest(ps, o.model_dir, vars, config)) {
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
          return recoverable([&] { return save_checkpoint(ps, ck, vars, step); });
        },
        {.every_n_steps = o.save_checkpoints_steps, .every_secs = o.save_checkpoints_secs}));
  }
  (session.add_hook(std::move(user_hooks)), ...);
  session.create();

  train_result result;
  double last_loss = 0;
  auto run_step = [&](const data::host_batch& b, auto&& add_scalars) {
    session.run([&](run_context& ctx) {
      run_values v;
      v.loss = recoverable([&] { return w.step(b); });
      last_loss = *v.loss;
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
    const auto train = shard_of(trainer).shuffle(o.seed + trainer).batch(o.batch).repeat(-1).prefetch(2);
    const auto& d = w.drops();
    const std::int64_t steps_per_epoch = std::max<std::int64_t>(1, epochs_last_step / std::max(1, o.epochs));
    std::int64_t next_epoch_eval = (session.global_step() / steps_per_epoch + 1) * steps_per_epoch;
    const std::int64_t first_step = session.global_step();
    auto stream = train.stream();
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
    const auto train = shard_of(trainer).shuffle(o.seed + trainer).batch(o.batch).repeat(o.epochs).prefetch(2);
    std::printf("%s: training on shard %zu of %zu (%zu examples), %d epochs\n", me.c_str(), trainer, trainers,
                train.size(), o.epochs);
    std::fflush(stdout);
    const auto& st = w.staleness();
    auto stream = train.stream();
    while (!session.should_stop()) {
      auto b = stream.next();
      if (!b) break;
      run_step(*b, [&](run_values& v) {
        v.scalars["staleness_mean"] = st.mean();
        v.scalars["staleness_max"] = double(st.max);
      });
      if (is_chief && b->index + 1 == train.batches_per_epoch()) recoverable([&] { log_epoch(b->epoch + 1); });
    }
    session.close();
    w.end();
    std::printf("%s: done after %lld steps; %llu pushes, staleness mean %.2f max %llu\n", me.c_str(),
                static_cast<long long>(session.context().local_step()), static_cast<unsigned long long>(st.pushes),
                st.mean(), static_cast<unsigned long long>(st.max));
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
    const auto deadline = train_clock::now() + std::chrono::seconds(o.finish_timeout_s);
    while (!result.stopped_by_signal && ps.workers_done() < trainers) {
      if (train_clock::now() > deadline)
        throw error(errc::timeout, "workers did not finish within " + std::to_string(o.finish_timeout_s) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling interval of workers_done
    }
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

/// A rank of a collective strategy.
template <class S, class M, class... Hooks>
train_result train_collective(cluster c, M& net, const data::dataset& train_set, const S& strategy,
                              const train_options& o, Hooks... user_hooks) {
  const auto started = train_clock::now();
  if (o.max_recoveries > 0)
    throw error(errc::invalid_config, "max_recoveries: a collective strategy has no parameter server");
  collective_options options;
  options.secret = o.secret;
  options.timeout_ms = o.timeout_ms;
  options.segment_bytes = o.segment_bytes;
  std::string me = "local", source = "none";
  std::optional<communicator> comm_holder;
  if (c.spec.jobs.empty()) {
    comm_holder.emplace(communicator::single(options));
  } else {
    options.cluster_id = c.id();
    me = c.self.str();
    source = c.source;
    comm_holder.emplace(make_communicator(c, options));
  }
  communicator& comm = *comm_holder;
  const std::size_t r = strategy.replicas_per_process();
  if (r == 0) throw error(errc::invalid_config, o.name + ": 0 replicas per process");
  const std::size_t global = r * comm.size();
  // Every rank runs the same number of steps: epochs × the smallest shard's batches per epoch.
  std::size_t per_epoch = SIZE_MAX;
  for (std::size_t g = 0; g < global; ++g)
    per_epoch = std::min(per_epoch, train_set.shard(global, g).batch(o.batch).batches_per_epoch());
  const std::int64_t epochs_last_step = std::int64_t(o.epochs) * std::int64_t(per_epoch);
  struct stream_of {  // batch streams neither copy nor move: build them in place
    explicit stream_of(const data::dataset& d) : s(d.stream()) {}
    data::batch_stream s;
  };
  std::vector<data::dataset> shards;
  for (std::size_t k = 0; k < r; ++k) {
    const std::size_t g = comm.rank() * r + k;
    shards.push_back(train_set.shard(global, g).shuffle(o.seed + g).batch(o.batch).repeat(-1).prefetch(2));
  }
  std::deque<stream_of> streams(shards.begin(), shards.end());

  auto engine = strategy.make(comm, net);
  engine.initialize(o.seed);
  const auto vars = net.variables();
  const bool is_chief = comm.rank() == 0;
  monitored_training_session session(
      {.is_chief = is_chief, .scaffold = hooks::collective_scaffold(comm, o.model_dir, vars, engine, me)});
  hooks::stop_on_signal signals(session, /*direct=*/false);
  // num_steps: N more steps from wherever this run starts (a resumed run included).
  std::shared_ptr<summary_writer> writer =
      add_standard_hooks(session, o, o.num_steps > 0 ? std::nullopt : std::optional(epochs_last_step), me, is_chief);
  if (!o.model_dir.empty()) {
    const checkpoint_options ck{.directory = o.model_dir, .max_to_keep = std::size_t(o.keep_checkpoints)};
    session.add_chief_hook(hooks::checkpoint_saver(
        [&, ck](std::int64_t step) { return hooks::save_replicated(ck, vars, engine, step); },
        {.every_n_steps = o.save_checkpoints_steps, .every_secs = o.save_checkpoints_secs}));
  }
  (session.add_hook(std::move(user_hooks)), ...);
  session.add_hook(hooks::agreed_stop{&comm});  // last: sees every other hook's stop request
  session.create();  // resumes from model_dir's latest checkpoint
  const std::int64_t last_step = o.last_step > 0 ? o.last_step : epochs_last_step;
  if (is_chief) {
    std::printf("%s: %s with %zu replicas x %zu processes (source %s), %zu parameters, batch %zu per replica; %lld steps\n",
                me.c_str(), o.name.c_str(), r, comm.size(), source.c_str(), num_parameters(vars), o.batch,
                static_cast<long long>(last_step));
    std::fflush(stdout);
  }

  train_result result;
  const auto t0 = train_clock::now();
  const std::int64_t first_step = engine.global_step();
  std::optional<nn::evaluation> eval;
  std::int64_t evaluated_at = -1;
  auto report = [&](const std::string& label) {
    if (!o.evaluate) return;
    eval = o.evaluate(engine.parameters());
    evaluated_at = engine.global_step();
    std::printf("%s: %s  test_loss %.4f  test_accuracy %.4f\n", me.c_str(), label.c_str(), eval->loss, eval->accuracy);
    std::fflush(stdout);
  };
  std::vector<data::host_batch> batches(r);
  std::vector<float> host_params;
  while (!session.should_stop()) {
    std::size_t examples = 0;
    for (std::size_t k = 0; k < r; ++k) {
      batches[k] = *streams[k].s.next();
      examples += batches[k].labels.size();
    }
    session.run([&](run_context& ctx) {
      run_values v;
      const double lr = double(engine.learning_rate());
      v.loss = double(engine.step(std::span<const data::host_batch>(batches)));
      result.loss = *v.loss;
      v.global_step = engine.global_step();
      v.examples = examples;
      v.scalars["learning_rate"] = lr;
      if (ctx.summaries_requested()) {
        host_params = hooks::host_parameters(engine);
        add_histograms(ctx, vars, host_params, v);
      }
      return v;
    });
    const std::int64_t s = engine.global_step();
    if (is_chief && s % std::int64_t(per_epoch) == 0 && s != evaluated_at)
      report("epoch " + std::to_string(s / std::int64_t(per_epoch)));
  }
  session.close();
  const double train_s = std::chrono::duration<double>(train_clock::now() - t0).count();
  const std::int64_t final_step = engine.global_step();
  const std::int64_t trained = std::max<std::int64_t>(1, final_step - first_step);
  comm.barrier();  // nobody leaves while another still needs its connections
  result.global_step = final_step;
  result.stopped_by_signal = hooks::stop_on_signal::stopped_by_signal();
  if (is_chief) {
    // Stopped part-way through an epoch (a step limit, a signal): evaluate what was trained.
    if (evaluated_at != final_step) report("stopped at step " + std::to_string(final_step));
    result.evaluation = eval;
    const double wall = std::chrono::duration<double>(train_clock::now() - started).count();
    char after[96];
    std::snprintf(after, sizeof after, "step_ms=%.2f samples_per_s=%.0f", 1e3 * train_s / double(trained),
                  double(trained) * double(o.batch) * double(global) / train_s);
    std::string before = o.result_extra.empty() ? "" : o.result_extra + " ";
    result.exit_code = report_result(o, me, comm.size(), eval, final_step, wall, before, after);
  }
  result.wall_s = std::chrono::duration<double>(train_clock::now() - started).count();
  return result;
}

}  // namespace detail

/// Runs this task's part of the job (see the file comment). `train_set`: the whole training
/// set (train shards it over the training tasks); `net`: the model (a collective strategy's
/// replicas copy it); `strategy`: a value modelling dtf::strategy; `partitioner`: places the
/// variables on the ps tasks (ps strategies); `user_hooks`: session hooks added after the
/// standard ones. Returns this task's result; result.exit_code is the process's exit status.
template <class S, class M, class P = partitioners::greedy_load_balancing, class... Hooks>
train_result train(const cluster& c, M& net, const data::dataset& train_set, S strategy, const train_options& o,
                   P layout_policy = {}, Hooks... user_hooks) {
  if constexpr (embedding_model<M>)
    static_assert(S::kind == strategy_kind::asynchronous,
                  "dtf::train: an embedding model (tables on the ps) trains with the asynchronous strategies only: "
                  "synchronous aggregation of sparse rows is not built yet, and the collective strategies hold the "
                  "whole model on every rank (no ps to hold the tables)");
  else
    static_assert(check_model<M>(), "dtf::train: the model does not model dtf::model (see the message above)");
  static_assert(check_strategy<S>(), "dtf::train: the strategy does not model dtf::strategy (see the message above)");
  static_assert(dtf::partitioner<P>, "dtf::train: the partitioner needs `p.place(vars, num_ps)` -> dtf::placement");
  static_assert((session_hook<Hooks> && ...), "dtf::train: every hook needs one of begin, after_create_session, "
                                               "before_run, after_run, end (dtf/session.hpp)");
  detail::validate(o);
  if constexpr (embedding_model<M> && S::kind != strategy_kind::asynchronous)
    return {};  // refused above
  else if constexpr (S::kind == strategy_kind::collective)
    return detail::train_collective(c, net, train_set, strategy, o, std::move(user_hooks)...);
  else
    return detail::train_through_ps(c, net, train_set, std::move(strategy), o, layout_policy, std::move(user_hooks)...);
}

}  // namespace dtf
