// dtf/train/collective.hpp — dtf::train's role for a collective strategy (ring-allreduce,
// mirrored): a rank with no ps, its replicas' batches (resumed where the restored global step
// puts them), the engine's steps, agreed stops and the rank-0 checkpoints. See dtf/train.hpp
// for the whole picture. A path whose dense variables go through the ring (with tables
// elsewhere) reuses the phases. In order, with what each guarantees on exit:
//   connect           connect_ring: ring.comm() is this rank's communicator over the cluster's
//                     tasks (or this process alone, with no cluster), its key derived from the
//                     job's secret (or options.ring_key); ring.me names this rank's lines.
//   replicas          shard_replicas: each of the job's replicas (replicas per process × ranks)
//                     has its shard, its start position and its batches per epoch; every rank
//                     runs the same steps, epochs × the smallest shard's batches per epoch.
//   initialise or     start_collective_session (after the engine's initialize from the seed):
//   restore           the session exists with the stop on a signal, the standard hooks, rank 0's
//                     checkpoint saver (model_dir), the caller's hooks and, last, the agreed stop;
//                     rank 0 restored the latest checkpoint when there is one (its step checked
//                     against the run's end) and every rank received it (else each keeps its
//                     initialisation); every rank holds rank 0's buffers; the start lines said.
//   resume            replica_positions: where the restored global step puts each of this
//                     rank's replicas in its shard (rank 0 says where).
//   run               run_replicas, then run_ring: one batch per replica per step until the
//                     ranks agree to stop, from the host streams (host_batches) or gathered on
//                     the device (device_batches, train_options::device_data); the losses read
//                     through a ring at the hooks' cadence where the engine and model allow it
//                     (train_options::loss_ring, dtf/train/loss_reads.hpp); rank 0 evaluates
//                     after each epoch. The engine's device::context orders the step on its
//                     compute stream (ring_allreduce), the device gather included
//                     (dtf/train/ring_batches.hpp); one rank's (or NCCL's) deferred step from device batches
//                     replays CUDA graphs where they apply (train_options::cuda_graph,
//                     step_graphs_on; section 7 of docs/design/gpu-execution.md).
//   finish            close_ring: the session closed (rank 0's final checkpoint), every rank past
//                     the barrier (no rank leaves while another needs its connections); then
//                     report_ring: rank 0 evaluated what was trained and printed the RESULT
//                     line; the result carries the exit code.
#pragma once

#include <dtf/cluster.hpp>
#include <dtf/collectives.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/data/position.hpp>
#include <dtf/hooks/agreed_stop.hpp>
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/hooks/collective_restore.hpp>
#include <dtf/hooks/stop_on_signal.hpp>
#include <dtf/session.hpp>
#include <dtf/train/buffers.hpp>
#include <dtf/train/loss_reads.hpp>
#include <dtf/train/report.hpp>
#include <dtf/train/ring_batches.hpp>
#include <dtf/train/resume.hpp>
#include <dtf/train/trusted_labels.hpp>
#include <dtf/transport/credentials.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtf::detail {

/// Connect: this rank's communicator and how it names itself.
struct ring_job {
  std::string me = "local", source = "none";
  std::optional<communicator> comm_holder;
  communicator& comm() { return *comm_holder; }
  bool is_chief() const { return comm_holder->rank() == 0; }
};

/// Connect (see the file comment). `c`: the cluster (no jobs: this process alone).
inline ring_job connect_ring(cluster& c, const train_options& o) {
  if (o.max_recoveries > 0)
    throw error(errc::invalid_config, "max_recoveries: a collective strategy has no parameter server");
  collective_options options;
  options.secret = !o.ring_key.empty() ? o.ring_key : o.secret.empty() ? std::string() : derive_ring_key(o.secret);
  options.tls = o.tls;  // every ring connection inside TLS 1.3 (errc::invalid_config without a secret)
  options.timeout_ms = o.timeout_ms;
  options.segment_bytes = o.segment_bytes;
  ring_job ring;
  if (c.spec.jobs.empty()) {
    ring.comm_holder.emplace(communicator::single(options));
  } else {
    options.cluster_id = c.id();
    ring.me = c.self.str();
    ring.source = c.source;
    ring.comm_holder.emplace(make_communicator(c, options));
  }
  return ring;
}

/// Replicas (see the file comment). Errors: errc::invalid_config for 0 replicas per process.
inline replica_data shard_replicas(communicator& comm, std::size_t r, const data::dataset& train_set,
                                   const train_options& o) {
  if (r == 0) throw error(errc::invalid_config, o.name + ": 0 replicas per process");
  replica_data d;
  d.r = r;
  d.global = r * comm.size();
  // Every rank runs the same number of steps: epochs × the smallest shard's batches per epoch.
  // Each replica's own shard starts as a data position (its layout, the start); a resumed run
  // moves them all on by the restored global step (replica_positions).
  d.starts.resize(d.global);
  d.batches_per_epoch.resize(d.global);
  for (std::size_t g = 0; g < d.global; ++g) {
    const auto shard = train_set.shard(d.global, g).batch(o.batch);
    d.batches_per_epoch[g] = shard.batches_per_epoch();
    d.per_epoch = std::min(d.per_epoch, shard.batches_per_epoch());
    d.starts[g] = data::position::start_of(d.global, shard.size(), o.batch, o.seed + g);
  }
  d.epochs_last_step = std::int64_t(o.epochs) * std::int64_t(d.per_epoch);
  for (std::size_t k = 0; k < r; ++k) {
    const std::size_t g = comm.rank() * r + k;
    d.shards.push_back(train_set.shard(d.global, g).shuffle(o.seed + g).batch(o.batch).repeat(-1).prefetch(2));
  }
  return d;
}

/// Initialise or restore: the session and what it needs to outlive (constructed in place: the
/// hooks and the scaffold refer to it).
struct collective_session {
  run_end end;           ///< what rank 0 checks a restored step against
  std::string restored;  ///< "checkpoint NAME of DIR" on rank 0, once restored
  std::vector<variable_spec> vars;
  std::optional<monitored_training_session> session;
  std::optional<hooks::stop_on_signal> signals;
  std::shared_ptr<summary_writer> writer;
  std::function<void(const checkpoint_manifest&)> restore_elsewhere;  ///< rank 0, before broadcasting (hybrid: tables)
  std::function<void(monitored_training_session&)> add_saver;  ///< in place of rank 0's saver (hybrid: every rank's)
};

/// The scaffold of a collective session: rank 0 restores and broadcasts (buffers included).
template <class M, class Engine>
session_scaffold collective_session_scaffold(collective_session& s, ring_job& ring, M& net, Engine& engine,
                                             const train_options& o) {
  const std::string& me = ring.me;
  auto check = [&s, &o](const checkpoint_manifest& man) {
    s.restored = "checkpoint " + man.name + " of " + o.model_dir;
    (void)check_start_step(man.global_step, s.end, s.restored);
    if (s.restore_elsewhere) s.restore_elsewhere(man);
  };
  session_scaffold scaffold = hooks::collective_scaffold(ring.comm(), o.model_dir, s.vars, engine, me, check);
  if constexpr (has_buffers<M>) {
    communicator& comm = ring.comm();
    // Every copy of the buffers starts as rank 0's: the restored checkpoint's when there is one
    // (before the session's first checkpoint can overwrite that checkpoint's buffers file).
    scaffold.restore = [restore = scaffold.restore, &comm, &net, &engine, &o, me]() -> std::optional<std::int64_t> {
      const auto step = restore();
      share_buffers(comm, net, engine, o.model_dir, step ? "ckpt-" + std::to_string(*step) : std::string(), me);
      return step;
    };
    scaffold.wait_ready = [wait = scaffold.wait_ready, &comm, &net, &engine, &o, me] {
      wait();
      share_buffers(comm, net, engine, o.model_dir, std::string(), me);
    };
  }
  return scaffold;
}

/// After the session's creation: every rank says so when it starts at or past its end (its
/// restore checked the step); rank 0 says what the job runs.
inline void announce_collective_start(const collective_session& s, ring_job& ring, const replica_data& d,
                                      std::int64_t start, const train_options& o) {
  const std::string& me = ring.me;
  const std::int64_t last_step = o.last_step > 0 ? o.last_step : d.epochs_last_step;
  const std::string from = !s.restored.empty() ? s.restored
                           : start > 0          ? "restored from " + o.model_dir
                                                : "a fresh start";
  if (const auto line = check_start_step(start, s.end, from); !line.empty()) {
    std::printf("%s: %s\n", me.c_str(), line.c_str());
    std::fflush(stdout);
  }
  if (ring.is_chief()) {
    std::printf("%s: %s with %zu replicas x %zu processes (source %s%s), %zu parameters, batch %zu per replica; %lld "
                "steps\n",
                me.c_str(), o.name.c_str(), d.r, ring.comm().size(), ring.source.c_str(),
                o.tls && ring.comm().size() > 1 ? ", ring inside TLS 1.3" : "", num_parameters(s.vars), o.batch,
                static_cast<long long>(last_step));
    std::fflush(stdout);
  }
}

/// Initialise or restore (see the file comment), after engine.initialize(seed).
template <class M, class Engine, class... Hooks>
void start_collective_session(collective_session& s, ring_job& ring, const replica_data& d, M& net, Engine& engine,
                              const train_options& o, Hooks... user_hooks) {
  const std::string& me = ring.me;
  const bool is_chief = ring.is_chief();
  s.vars = net.variables();
  // Rank 0 refuses a checkpoint whose step this configuration never reaches (dtf/train/resume.hpp).
  s.end = run_end{.last_step = o.num_steps > 0 ? std::nullopt
                                        : std::optional(o.last_step > 0 ? o.last_step : d.epochs_last_step),
           .num_steps = o.num_steps,
           .what = o.last_step > 0 ? "--last_step" : "--epochs " + std::to_string(o.epochs)};
  s.session.emplace(
      session_options{.is_chief = is_chief, .scaffold = collective_session_scaffold(s, ring, net, engine, o)});
  monitored_training_session& session = *s.session;
  s.signals.emplace(session, /*direct=*/false);
  // num_steps: N more steps from wherever this run starts (a resumed run included).
  s.writer = add_standard_hooks(session, o, o.num_steps > 0 ? std::nullopt : std::optional(d.epochs_last_step), me,
                                is_chief);
  if (s.add_saver) {
    s.add_saver(session);
  } else if (!o.model_dir.empty()) {
    const checkpoint_options ck{.directory = o.model_dir, .max_to_keep = std::size_t(o.keep_checkpoints)};
    session.add_chief_hook(hooks::checkpoint_saver(
        [&s, &net, &engine, ck](std::int64_t step) {
          take_replica_buffers(net, engine);  // the job's buffers are rank 0's replica 0's
          save_buffers(net, ck.directory, ck.prefix + "-" + std::to_string(step));
          return hooks::save_replicated(ck, s.vars, engine, step);
        },
        {.every_n_steps = o.save_checkpoints_steps, .every_secs = o.save_checkpoints_secs}));
  }
  (session.add_hook(std::move(user_hooks)), ...);
  session.add_hook(hooks::agreed_stop{&ring.comm()});  // last: sees every other hook's stop request
  session.create();  // resumes from model_dir's latest checkpoint
  announce_collective_start(s, ring, d, engine.global_step(), o);
}

/// Resume, first (see the file comment): where this rank's replicas resume. Restarts redo no
/// work: every replica trains exactly one batch of its endless stream per global step, so after
/// a restore to step S replica g is S batches into its shard, at epoch S / its own batches per
/// epoch (shards may differ by one example, and so by one batch).
inline std::vector<data::position> replica_positions(ring_job& ring, const replica_data& d, std::int64_t global_step) {
  const auto restored_step = std::uint64_t(std::max<std::int64_t>(0, global_step));
  std::vector<data::position> at(d.global);
  for (std::size_t g = 0; g < d.global; ++g) at[g] = d.starts[g].after(restored_step, d.batches_per_epoch[g]);
  if (ring.is_chief() && restored_step > 0) {
    std::printf("%s\n", resumed_positions(ring.me, restored_step, at).c_str());
    std::fflush(stdout);
  }
  return {at.begin() + std::ptrdiff_t(ring.comm().rank() * d.r), at.begin() + std::ptrdiff_t((ring.comm().rank() + 1) * d.r)};
}

/// What the run leaves to the finish: when its steps began, rank 0's last evaluation; then
/// what close_ring measured.
struct ring_run {
  train_clock::time_point t0;
  std::int64_t first_step = 0;
  std::optional<nn::evaluation> eval;
  std::int64_t evaluated_at = -1;  ///< the global step of `eval`
  double train_s = 0;              ///< from t0 to the session's close
  std::int64_t final_step = 0, trained = 0;  ///< the global step at the close; steps run (at least 1)
};

/// Rank 0's evaluation of the trained variables (replica 0's buffers), said with `label`.
template <class M, class Engine>
void evaluate_ring(ring_run& run, M& net, Engine& engine, const train_options& o, const std::string& me,
                   const std::string& label) {
  if (!o.evaluate) return;
  take_replica_buffers(net, engine);
  run.eval = o.evaluate(engine.parameters());
  run.evaluated_at = engine.global_step();
  std::printf("%s: %s  test_loss %.4f  test_accuracy %.4f\n", me.c_str(), label.c_str(), run.eval->loss,
              run.eval->accuracy);
  std::fflush(stdout);
}

/// Run (see the file comment): the session's steps until it should stop (not closed yet).
/// `vars`: the engine's variables (for histograms).
template <class M, class Engine, class Batches>
ring_run run_ring(monitored_training_session& session, const std::vector<variable_spec>& vars, ring_job& ring,
                  const replica_data& d, Batches& batches, M& net, Engine& engine, const train_options& o,
                  train_result& result) {
  ring_run run{.t0 = train_clock::now(), .first_step = engine.global_step()};
  std::vector<float> host_params;
  auto losses = step_losses::make<Engine, Batches>(  // the losses through a ring, or nullopt
      o, o.num_steps > 0 ? run.first_step + o.num_steps : o.last_step > 0 ? o.last_step : d.epochs_last_step);
  while (!session.should_stop()) {
    const std::size_t examples = batches.next();
    session.run([&](run_context& ctx) {
      run_values v;
      const double lr = double(engine.learning_rate());
      step_losses::step(batches, engine, losses, ctx, v, result);
      v.global_step = engine.global_step();
      v.examples = examples;
      v.scalars["learning_rate"] = lr;
      if (ctx.summaries_requested()) {
        host_params = hooks::host_parameters(engine);
        add_histograms(ctx, vars, host_params, v);
      }
      return v;
    });
    const std::int64_t step = engine.global_step();
    if (ring.is_chief() && step % std::int64_t(d.per_epoch) == 0 && step != run.evaluated_at)
      evaluate_ring(run, net, engine, o, ring.me, "epoch " + std::to_string(step / std::int64_t(d.per_epoch)));
  }
  if (losses) losses->finish(result);
  return run;
}

/// The engine's step graphs for one run from device batches (train_options::cuda_graph, with the
/// loss read through the ring: the deferred step), off again when the run ends; an engine without
/// them (or where they do not apply: ring_allreduce::use_step_graphs) steps eagerly.
template <class Engine>
class step_graphs_on {
 public:
  step_graphs_on(Engine& engine, const train_options& o) : engine_(engine) {
    if constexpr (requires { engine.use_step_graphs(true); })
      if (o.cuda_graph && o.loss_ring) on_ = engine.use_step_graphs(true);
  }
  step_graphs_on(const step_graphs_on&) = delete;
  step_graphs_on& operator=(const step_graphs_on&) = delete;
  ~step_graphs_on() {
    if constexpr (requires { engine_.use_step_graphs(false); })
      if (on_) engine_.use_step_graphs(false);
  }

 private:
  Engine& engine_;
  bool on_ = false;
};

/// Run from `at` (this rank's replicas' positions), the batches gathered on the device when the
/// options ask for it and the engine takes them (train_options::device_data, one replica per
/// process), else from the host streams.
template <class M, class Engine>
ring_run run_replicas(collective_session& s, ring_job& ring, const replica_data& d,
                      const std::vector<data::position>& at, M& net, Engine& engine, const train_options& o,
                      train_result& result) {
  if constexpr (takes_device_batches<Engine>) {
    if (o.device_data && d.r == 1) {
      device_batches batches(d, at.front(), labels_checked_at_upload<M>::classes(net));
      if constexpr (requires { engine.stream(); }) batches.shard.set_stream(engine.stream());  // the step's stream
      labels_checked_at_upload<M> trusted(net);
      step_graphs_on graphs(engine, o);  // where they apply (section 7 of docs/design/gpu-execution.md)
      return run_ring(*s.session, s.vars, ring, d, batches, net, engine, o, result);
    }
  }
  host_batches batches(d, at);
  return run_ring(*s.session, s.vars, ring, d, batches, net, engine, o, result);
}

/// Finish, first: the session's close (rank 0's final checkpoint), `before_barrier` (a hybrid
/// rank's done report to the ps), then the barrier (nobody leaves while another still needs
/// its connections); `run` gets the close's measures.
template <class Engine>
void close_ring(monitored_training_session& session, ring_job& ring, ring_run& run, Engine& engine,
                const std::function<void()>& before_barrier = {}) {
  session.close();
  run.train_s = std::chrono::duration<double>(train_clock::now() - run.t0).count();
  run.final_step = engine.global_step();
  run.trained = std::max<std::int64_t>(1, run.final_step - run.first_step);
  if (before_barrier) before_barrier();
  ring.comm().barrier();
}

/// Finish, then: the result; rank 0 evaluates what was trained (unless the last epoch's end
/// did) and prints the RESULT line. `started`: the task's start, its wall time counts from there.
template <class M, class Engine>
void report_ring(ring_job& ring, const replica_data& d, ring_run& run, M& net, Engine& engine,
                 const train_options& o, train_result& result, train_clock::time_point started) {
  const std::int64_t final_step = run.final_step;
  result.global_step = final_step;
  result.stopped_by_signal = hooks::stop_on_signal::stopped_by_signal();
  if (ring.is_chief()) {
    // Stopped part-way through an epoch (a step limit, a signal): evaluate what was trained.
    if (run.evaluated_at != final_step)
      evaluate_ring(run, net, engine, o, ring.me, "stopped at step " + std::to_string(final_step));
    result.evaluation = run.eval;
    const double wall = std::chrono::duration<double>(train_clock::now() - started).count();
    char after[96];
    std::snprintf(after, sizeof after, "step_ms=%.2f samples_per_s=%.0f", 1e3 * run.train_s / double(run.trained),
                  double(run.trained) * double(o.batch) * double(d.global) / run.train_s);
    std::string before = o.result_extra.empty() ? "" : o.result_extra + " ";
    result.exit_code = report_result(o, ring.me, ring.comm().size(), run.eval, final_step, wall, before, after);
  }
  result.wall_s = std::chrono::duration<double>(train_clock::now() - started).count();
}

/// A rank of a collective strategy, through the phases above.
template <class S, class M, class... Hooks>
train_result train_collective(cluster c, M& net, const data::dataset& train_set, const S& strategy,
                              const train_options& o, Hooks... user_hooks) {
  const auto started = train_clock::now();
  const S configured = with_loop_options(strategy, o);  // clip_norm, backward_passes_per_step
  ring_job ring = connect_ring(c, o);  // connect
  const replica_data d = shard_replicas(ring.comm(), strategy.replicas_per_process(), train_set, o);
  auto engine = configured.make(ring.comm(), net);  // initialise or restore
  engine.initialize(o.seed);
  collective_session s;
  start_collective_session(s, ring, d, net, engine, o, std::move(user_hooks)...);
  const auto at = replica_positions(ring, d, engine.global_step());  // resume
  train_result result;
  ring_run run = run_replicas(s, ring, d, at, net, engine, o, result);  // run
  close_ring(*s.session, ring, run, engine);  // finish
  if constexpr (adopts_parameters<M>) net.set_parameters(engine.parameters());  // every rank holds rank 0's
  report_ring(ring, d, run, net, engine, o, result, started);
  return result;
}
}  // namespace dtf::detail
