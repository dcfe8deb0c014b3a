// dtf/train/ps_job.hpp — the phases of a parameter-server job that do not depend on the
// strategy: the ps role, and a training task's connection, session, data position and end.
// through_ps.hpp runs them around a strategy's worker; a path that keeps only some of its
// variables on the ps (embedding tables) runs them around its own steps. In order, with what
// each guarantees on exit:
//   serve_ps          the ps role: served until the chief's shutdown; returns its result.
//   connect           ps_job's constructor: this task is a worker or the chief (else
//                     errc::invalid_config), knows its index among the training tasks, and
//                     job.ps is connected to every ps task. Nothing is on the ps yet.
//   initialise or     start_ps_session: the session exists with, in this order, the stop on a
//   restore           signal, the recovery (max_recoveries > 0), the standard hooks, the chief's
//                     checkpoint saver (model_dir) and the caller's hooks; the chief created the
//                     tables, then restored the latest checkpoint (its step and positions checked
//                     against the run's end; s.restored names it) or initialised the ps; every
//                     other task waited until each ps was ready. session->global_step() is the
//                     step the run starts at; a start at or past the end has been said.
//   resume_position   this task's data position: the one ps 0 recorded for it when usable (said
//                     in a line), else the start of its shard.
//   run               the strategy's steps (through_ps.hpp), each through s.recoverable, up to
//                     the session's close (its final checkpoint).
//   finish            finish_ps_job: this task reported done; the chief waited for every worker
//                     (not after a stop request), evaluated, printed the RESULT line, shut the ps
//                     down (shutdown_ps) and wrote the metrics file; the result carries the exit
//                     code.
// From the session on, a lost ps is recovered and the operation retried (s.recoverable).
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/cluster.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/data/position.hpp>
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/hooks/stop_on_signal.hpp>
#include <dtf/ps.hpp>
#include <dtf/ps/positions.hpp>
#include <dtf/recovery.hpp>
#include <dtf/session.hpp>
#include <dtf/train/report.hpp>
#include <dtf/train/resume.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::detail {

/// The ps role: serve until the chief's shutdown.
/// threads: its I/O threads (lock-free strategies get one per trainer at least, so updates
/// from different workers are applied concurrently, as Hogwild means).
inline train_result serve_ps(const cluster& c, const placement& layout, const transport_options& t,
                             const train_options& o, int threads) {
  const auto t0 = train_clock::now();
  const std::string me = c.self.str();
  if (o.secret.empty() && !o.task_key.empty())
    throw error(errc::invalid_config, o.name + ": " + me + " holds only a task key; a ps needs the master secret "
                                      "($DTF_CLUSTER_SECRET or --secret_file) to authenticate its peers");
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

/// Every task's transport in a ps job: its identity in the cluster and the job's credentials.
inline transport_options ps_transport(const cluster& c, const train_options& o) {
  transport_options transport;
  transport.cluster_id = c.id();
  transport.identity = c.self.str();
  transport.secret = o.secret;
  transport.task_key = o.task_key;
  transport.tls = o.tls;
  transport.timeout_ms = o.timeout_ms;
  return transport;
}

/// This task's name, once it is known to be a training task (a worker or the chief).
inline std::string training_task_name(const cluster& c, const train_options& o) {
  if (c.self.job != "worker" && c.self.job != "chief")
    throw error(errc::invalid_config, o.name + " runs as ps, worker or chief, not " + c.self.job);
  return c.self.str();
}

/// The addresses of the cluster's ps tasks, in order.
inline std::vector<std::string> ps_addresses(const cluster& c) {
  std::vector<std::string> addresses;
  for (const auto& t : c.spec.tasks("ps")) addresses.push_back(c.spec.address(t));
  return addresses;
}

/// Connect: what a training task of a ps job holds from its start to its end. Constructed in
/// place (the worker, the session and the recovery refer to its client).
struct ps_job {
  ps_job(const cluster& c, const train_options& o, std::vector<variable_spec> vars, const placement& layout,
         const transport_options& t, train_clock::time_point started)
      : c(c),
        o(o),
        started(started),
        me(training_task_name(c, o)),
        vars(std::move(vars)),
        trainers(num_trainers(c)),
        trainer(trainer_index(c)),
        is_chief(c.is_chief()),
        ps(ps_addresses(c), layout, t) {
    ps.connect();
  }
  ps_job(const ps_job&) = delete;
  ps_job& operator=(const ps_job&) = delete;

  const cluster& c;
  const train_options& o;
  const train_clock::time_point started;  ///< the task's start: its wall time counts from here
  const std::string me;                   ///< "worker.1": the start of each line it prints
  const std::vector<variable_spec> vars;  ///< the variables the ps hold (and checkpoints carry)
  const std::size_t trainers, trainer;    ///< the training tasks, and this one's index among them
  const bool is_chief;
  ps_client ps;  ///< connected to every ps task
};

/// What start_ps_session needs of the path that trains (the strategy's half, through_ps.hpp).
struct ps_start {
  ps_config config;                                       ///< as ps_client::initialize takes it
  std::function<void()> init;                             ///< chief, no checkpoint: initialise the ps
  std::function<void(std::span<const float>)> restored;   ///< chief: the restored values into the model
  embedding_tables* tables = nullptr;                     ///< saved and restored with the variables
  std::function<void()> create_tables;                    ///< chief, before the session creates
  run_end end;                                            ///< what a restored step is checked against
  std::optional<std::int64_t> own_last;                   ///< the stop-at-step hook's end (no flag set)
  /// Chief: further checks of the checkpoint about to be restored (`source` names it).
  std::function<void(const checkpoint_manifest&, const std::string& source)> check;
  std::function<void(const std::string& dir, const std::string& name)> restore_buffers;  ///< after a restore
  std::function<void(const std::string& dir, const std::string& name)> save_buffers;  ///< before a manifest
  std::function<void()> recovered;  ///< after each recovery of a lost ps, before the retry
  std::function<void()> share_buffers;  ///< after init or restore: the chief publishes, a worker takes
};

/// Initialise or restore: the session and what it needs to outlive (constructed in place: the
/// hooks and the scaffold refer to it). s.start is set before start_ps_session.
struct ps_session {
  ps_start start;
  std::string restored;  ///< "checkpoint NAME of DIR", once the chief restores one
  std::string restored_name;  ///< NAME: the checkpoint's own (a save's step may lag its manifest's)
  std::optional<monitored_training_session> session;
  std::optional<hooks::stop_on_signal> signals;
  std::optional<ps_recovery> recovery;
  std::shared_ptr<summary_writer> writer;

  /// f(), retried after the recovery of a lost ps when the job has max_recoveries.
  template <class F>
  decltype(auto) recoverable(F&& f) {
    if (recovery) return recovery->run(f);
    return f();
  }
};

/// The scaffold of a ps job's session: restore (the buffers with the checkpoint), or initialise.
inline session_scaffold ps_session_scaffold(ps_job& job, ps_session& s) {
  const train_options& o = job.o;
  // The chief refuses a checkpoint whose step or positions this configuration never reaches
  // (dtf/train/resume.hpp), before the ps tasks get any of it; every task checks its start.
  session_scaffold scaffold = ps_scaffold(job.ps, {.checkpoint_dir = o.model_dir,
                                                  .variables = job.vars,
                                                  .config = s.start.config,
                                                  .init = s.start.init,
                                                  .ready_timeout = std::chrono::milliseconds(o.timeout_ms),
                                                  .restored = s.start.restored,
                                                  .tables = s.start.tables,
                                                  .check = [&job, &s](const checkpoint_manifest& man) {
                                                    s.restored_name = man.name;
                                                    s.restored = "checkpoint " + man.name + " of " + job.o.model_dir;
                                                    (void)check_start_step(man.global_step, s.start.end, s.restored);
                                                    if (s.start.check) s.start.check(man, s.restored);
                                                  }});
  if (s.start.restore_buffers)  // the chief's buffers come back with the checkpoint it restored
    scaffold.restore = [restore = scaffold.restore, &s, dir = o.model_dir]() -> std::optional<std::int64_t> {
      const auto step = restore();
      if (step) s.start.restore_buffers(dir, s.restored_name);
      return step;
    };
  return scaffold;
}

/// The chief's re-initialisation of a ps that came back empty: every ps from the latest
/// checkpoint, or from scratch when there is none.
inline void reinitialise_ps(ps_job& job, ps_session& s) {
  const train_options& o = job.o;
  if (o.model_dir.empty() || !restore_latest(job.ps, o.model_dir, job.vars, s.start.config, {},
                                             checkpoint_fallback::newest_valid, restore_transfer::through_chief,
                                             s.start.tables)) {
    std::fprintf(stderr, "%s: no checkpoint to restore the parameter servers from; initialising afresh\n",
                 job.me.c_str());
    if (s.start.init) s.start.init();
  }
  if (s.start.share_buffers && job.is_chief) s.start.share_buffers();  // ps 0 may have lost them
}

/// The chief's checkpoints of the ps (model_dir): the buffers, then the manifest.
inline void add_ps_checkpoint_saver(ps_job& job, ps_session& s) {
  const train_options& o = job.o;
  const checkpoint_options ck{.directory = o.model_dir, .max_to_keep = std::size_t(o.keep_checkpoints)};
  s.session->add_chief_hook(hooks::checkpoint_saver(
      [&job, &s, ck](std::int64_t step) -> checkpoint_manifest {
        if (s.start.save_buffers)
          s.start.save_buffers(ck.directory, ck.prefix + "-" + std::to_string(step));  // before the manifest
        return s.recoverable([&] { return save_checkpoint(job.ps, ck, job.vars, step); });
      },
      {.every_n_steps = o.save_checkpoints_steps, .every_secs = o.save_checkpoints_secs}));
}

/// Initialise or restore (see the file comment): s.session created with its hooks.
template <class... Hooks>
void start_ps_session(ps_job& job, ps_session& s, Hooks... user_hooks) {
  const train_options& o = job.o;
  s.session.emplace(session_options{.is_chief = job.is_chief, .scaffold = ps_session_scaffold(job, s)});
  monitored_training_session& session = *s.session;
  s.signals.emplace(session);
  if (o.max_recoveries > 0)
    s.recovery.emplace(job.ps, job.is_chief, [&job, &s] { reinitialise_ps(job, s); },
                       recovery_options{.max_recoveries = o.max_recoveries,
                                        .ready_timeout = std::chrono::milliseconds(o.timeout_ms)},
                       s.start.recovered);
  s.writer = add_standard_hooks(session, o, s.start.own_last, job.me, job.is_chief);
  if (!o.model_dir.empty()) add_ps_checkpoint_saver(job, s);
  (session.add_hook(std::move(user_hooks)), ...);
  // The tables exist before the session restores or initialises (a restore fills them).
  if (s.start.create_tables && job.is_chief) s.recoverable([&] { s.start.create_tables(); });
  session.create();
  if (s.start.share_buffers) s.recoverable([&] { s.start.share_buffers(); });  // the chief's buffers everywhere
  // A start at or past the end says so; one beyond what this configuration reaches is an error.
  if (const auto line = check_start_step(session.global_step(), s.start.end,
                                         s.restored.empty() ? "on the parameter servers" : s.restored);
      !line.empty()) {
    std::printf("%s: %s\n", job.me.c_str(), line.c_str());
    std::fflush(stdout);
  }
}

/// Where this task is in its data: its recorded position when it has one (a restarted task, or
/// a job resumed from a checkpoint that carries positions), else the start of `shard` (its own,
/// of `batches_per_epoch` batches). `epochs`: those an asynchronous task trains (resume.hpp).
inline data::position resume_position(ps_job& job, ps_session& s, const data::dataset& shard,
                                      std::uint64_t batches_per_epoch, std::optional<std::uint64_t> epochs) {
  const train_options& o = job.o;
  const std::string& me = job.me;
  data::position at = data::position::start_of(job.trainers, shard.size(), o.batch, o.seed + job.trainer);
  if (o.position_every <= 0) return at;
  const auto recorded = s.recoverable([&] { return recorded_position(job.ps); });
  if (!recorded) return at;
  if (const auto why = recorded->unusable_in(at, batches_per_epoch)) {
    std::fprintf(stderr, "%s: not resuming the data position recorded for this task (%s); starting its shard over\n",
                 me.c_str(), why->c_str());
    return at;
  }
  at = *recorded;
  const bool finished = check_position(at, batches_per_epoch, epochs, me, "the position ps 0 holds");
  std::printf("%s: resuming its shard at epoch %llu, batch %llu (%llu examples in %llu steps trained before)\n",
              me.c_str(), static_cast<unsigned long long>(at.epoch), static_cast<unsigned long long>(at.batch),
              static_cast<unsigned long long>(at.examples), static_cast<unsigned long long>(at.steps));
  if (finished)
    std::printf("%s: that is the end of its %d epochs: training already finished, nothing to train\n", me.c_str(),
                o.epochs);
  std::fflush(stdout);
  return at;
}

/// Finish, the chief's last act: every ps task shut down, said in a line.
inline void shutdown_ps(ps_job& job) {
  job.ps.shutdown();
  std::printf("%s: parameter servers shut down\n", job.me.c_str());
  std::fflush(stdout);
}

/// Finish, after the session's close: report done; the chief waits for every worker (not
/// after a stop request: the job ends now, and tasks still training lose their parameter
/// servers), evaluates, prints the RESULT line (`extra`: its kind-specific tokens) and shuts
/// the parameter servers down. `evaluate()`: the chief's evaluation of the trained variables;
/// `task_step()`: this task's own view of the global step. Fills the rest of `result`.
template <class Evaluate, class Step>
void finish_ps_job(ps_job& job, ps_session& s, train_result& result, std::string extra, Evaluate&& evaluate,
                   Step&& task_step) {
  const train_options& o = job.o;
  if (!o.result_extra.empty()) extra = o.result_extra + " " + extra;
  result.stopped_by_signal = hooks::stop_on_signal::stopped_by_signal();
  result.exit_code = s.recoverable([&] {
    job.ps.mark_done();
    result.global_step = task_step();
    if (!job.is_chief) return 0;
    if (!result.stopped_by_signal &&
        job.ps.wait_workers_done(job.trainers, std::chrono::seconds(o.finish_timeout_s)) < job.trainers)
      throw error(errc::timeout, "workers did not finish within " + std::to_string(o.finish_timeout_s) + " s");
    result.evaluation = evaluate();
    result.global_step = job.ps.global_step();
    const double wall = std::chrono::duration<double>(train_clock::now() - job.started).count();
    print_result(o, job.me, job.trainers, result.evaluation, result.global_step, wall, "", extra,
                 /*done_line=*/false);
    shutdown_ps(job);
    return check_result(o, job.me, job.trainers, result.evaluation, result.global_step, wall);
  });
  result.recoveries = s.recovery ? s.recovery->recoveries() : 0;
  result.wall_s = std::chrono::duration<double>(train_clock::now() - job.started).count();
}

}  // namespace dtf::detail
