// dtf/train/hybrid.hpp — dtf::train's roles for dtf::strategies::hybrid (docs/design/hybrid.md):
// an embedding model's tables on the ps tasks, its dense variables on a ring of the training
// tasks. See dtf/train.hpp for the whole picture.
//
// train_hybrid reuses the phases of the other two paths, in order, with what each guarantees:
//   refusals          a cluster without ps tasks is errc::invalid_config naming the strategy,
//                     before anything connects.
//   ps role           serve_ps (ps_job.hpp) with a placement of no dense shard: the ps holds the
//                     tables only; served until rank 0's shutdown.
//   connect           the ps_job constructor (ps_job.hpp): connected to every ps; then
//                     connect_ring (collective.hpp): this rank's communicator over the training
//                     tasks (ps tasks take no part).
//   replicas          shard_replicas: one replica per rank, its shard and start.
//   initialise        the engine's initialize: rank 0 creates the tables on every ps (the rows'
//                     rule: options.embedding_rule, else the dense rule) and, with synchronous
//                     tables, initialises the ps for the sync protocol (no dense shard), then
//                     broadcasts the dense variables initialised from the seed; then start_collective_session:
//                     the session with the collective path's hooks (the agreed stop last), with
//                     model_dir the checkpoints of both halves (dtf/train/hybrid_checkpoint.hpp:
//                     hybrid_checkpoints on every rank in place of rank 0's saver) and the restore
//                     of the latest: rank 0 restores the tables into the ps (restore_hybrid) before
//                     it broadcasts the dense part.
//   resume, run       replica_positions (where the global step puts each rank), run_replicas: one host
//                     batch per rank and step until the ranks agree to stop; rank 0 evaluates
//                     after each epoch through options.evaluate_rows (the dense replica and a
//                     reader of the rows on the ps).
//   finish            close_ring, with the rank's done report to every ps before its barrier
//                     (its departure is not a lost replica's), report_ring (the RESULT line, with
//                     tables=<mode> ps=<n>), then rank 0 shuts the ps down (shutdown_ps): every
//                     push and done report was acknowledged before the ring's barrier, so nothing
//                     is in flight. A rank 0 that fails shuts the ps down on its way out.
//   a lost ps         (docs/design/hybrid.md section 4) a ps request that fails with
//                     errc::peer_failure or errc::timeout (the ps died; dtfrun may have restarted
//                     it, empty) is kept by the engine until the ranks' next agreement: after
//                     each step (the step's ring collectives still run, with zero rows), after
//                     the done reports at the end, or rank 0's word after a save; rank 0's
//                     evaluation keeps it too. Every rank then throws strategies::lost_ps at the
//                     same point, so none waits in a collective. Up to max_recoveries times the
//                     session ends and starts again (recover_hybrid_ps: every rank drops its
//                     stale connections and reconnects; rank 0 says whether there is a
//                     checkpoint): rank 0 restores the latest checkpoint's tables and every ps's
//                     step (restore_hybrid, the restore path) and broadcasts the dense part and
//                     step; every rank resumes its data at that step, the batches since trained
//                     again. Beyond that, or with no checkpoint, every rank ends with lost_ps
//                     naming the ps (where this rank saw it) and the cause. A dead rank still
//                     ends the job (the ring has no elastic membership).
#pragma once

#include <dtf/cluster.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/error.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/strategies/hybrid.hpp>
#include <dtf/train/collective.hpp>
#include <dtf/train/hybrid_checkpoint.hpp>
#include <dtf/train/options.hpp>
#include <dtf/train/ps_job.hpp>

#include <cstdio>
#include <concepts>
#include <exception>
#include <optional>
#include <string>
#include <utility>

namespace dtf::detail {

/// The refusals of a hybrid job (see the file comment), before anything connects.
inline void check_hybrid_job(const cluster& c, const strategies::hybrid& strategy, const train_options& o) {
  const std::string who = o.name + " (dtf::strategies::hybrid)";
  if (c.num_ps() == 0)
    throw error(errc::invalid_config, who + ": the cluster has no ps tasks to hold the embedding tables "
                                            "(a model without tables trains with dtf::strategies::ring_allreduce)");
}

/// The options the collective phases see on a hybrid rank: rank 0's evaluation reads the rows
/// through the engine's tables (options.evaluate_rows), and the RESULT line names the tables'
/// mode and the ps.
template <class Engine>
train_options hybrid_ring_options(const train_options& o, Engine& engine, std::size_t num_ps) {
  train_options ro = o;  // without evaluate_rows: options.evaluate of the dense part, as the ps path
  if (o.evaluate_rows)
    ro.evaluate = [&o, &engine, reader = strategies::detail::read_rows(engine.tables())](std::span<const float> p) {
      // A ps lost while rank 0 reads rows is the next agreement's (a step's or the end's), so
      // the other ranks learn of it where they are; the evaluation is void (the job rewinds or ends).
      nn::evaluation e{};
      engine.guard([&] { e = o.evaluate_rows(p, reader); });
      return e;
    };
  const std::string tokens = std::string("tables=") + strategies::to_string(engine.table_mode()) +
                             " ps=" + std::to_string(num_ps);
  ro.result_extra = o.result_extra.empty() ? tokens : o.result_extra + " " + tokens;
  return ro;
}

/// The recovery of a lost ps, on every rank after the ranks agreed on it (strategies::lost_ps,
/// see the file comment): reconnect to every ps; rank 0 says whether model_dir has a checkpoint
/// to rewind to, and without one every rank ends with `why` and the missing checkpoint.
inline void recover_hybrid_ps(ps_job& job, ring_job& ring, const train_options& o, const strategies::lost_ps& why,
                              int recovery) {
  std::fprintf(stderr, "%s: %s; recovery %d of %d: every rank rewinds to the latest checkpoint\n", ring.me.c_str(),
               why.message().c_str(), recovery, o.max_recoveries);
  // A rank that did not talk to the restarted ps since may hold a connection to the old one:
  // a request to every ps finds it (and drops it); then every dropped connection is made again
  // (the restarted ps listens again; bounded by the connect timeout).
  try {
    (void)job.ps.ready();
  } catch (const error& e) {
    if (e.code() != make_error_code(errc::peer_failure) && e.code() != make_error_code(errc::timeout)) throw;
  }
  job.ps.reconnect();
  std::int64_t have[1] = {0};
  if (ring.is_chief()) have[0] = !o.model_dir.empty() && read_checkpoint_state(o.model_dir) ? 1 : 0;
  if (ring.comm().size() > 1) ring.comm().broadcast("hybrid/recover", std::span<std::int64_t>(have), 0);
  if (have[0] == 0)
    throw strategies::lost_ps(why.code(), why.message() + "; no checkpoint to restore the parameter servers from" +
                                              (o.model_dir.empty() ? " (no model_dir)" : " in " + o.model_dir));
}

/// A rank's part of a hybrid job after the connections: initialise, run, finish (see the file
/// comment). Returns its result. With max_recoveries, a lost ps agreed on by every rank starts
/// the session again from the latest checkpoint (the hooks given again, as copies).
template <class M, class... Hooks>
train_result run_hybrid_rank(ps_job& job, ring_job& ring, const data::dataset& train_set,
                             const strategies::hybrid& strategy, M& net, const train_options& o,
                             Hooks... user_hooks) {
  const replica_data d = shard_replicas(ring.comm(), strategy.replicas_per_process(), train_set, o);
  auto engine = strategy.make(ring.comm(), job.ps, net);  // initialise
  if (o.embedding_rule) engine.set_embedding_rule(*o.embedding_rule);
  engine.initialize(o.seed);
  engine.agree_on_lost_ps(true);  // every rank ends or recovers at the same step, none waits in the ring
  const train_options ro = hybrid_ring_options(o, engine, job.c.num_ps());
  for (int recoveries = 0;; ++recoveries) {
    std::optional<strategies::lost_ps> lost;
    {
      collective_session s;
      if (!o.model_dir.empty()) {  // both halves in every checkpoint, restored together
        s.restore_elsewhere = [&job, &engine, &o](const checkpoint_manifest& man) {
          restore_hybrid(job.ps, o.model_dir, man, engine.tables(), engine.ps_settings());
        };
        s.add_saver = [&job, &ring, &engine, &o, &s](monitored_training_session& session) {
          const checkpoint_options ck{.directory = o.model_dir, .max_to_keep = std::size_t(o.keep_checkpoints)};
          auto save = [&job, &engine, &s, ck](std::int64_t step) {
            return save_hybrid(job.ps, ck, s.vars, engine, step);
          };
          session.add_hook(hybrid_checkpoints(ring.comm(), save, o.save_checkpoints_steps, o.save_checkpoints_secs));
        };
      }
      try {
        if constexpr ((std::copy_constructible<Hooks> && ...)) {
          start_collective_session(s, ring, d, net, engine, ro, user_hooks...);  // copies: kept for a recovery
        } else {
          if (o.max_recoveries > 0)
            throw error(errc::invalid_config, o.name + ": max_recoveries: a hybrid job's hooks must be copyable "
                                                       "(a recovery starts the session again with them)");
          start_collective_session(s, ring, d, net, engine, ro, std::move(user_hooks)...);
        }
        if (ring.is_chief() && recoveries == 0) {  // the job is not mistaken for a plain ring job
          std::printf("%s: hybrid: %zu embedding tables on %zu ps (%s updates), the dense part by ring-allreduce "
                      "over %zu ranks%s\n",
                      ring.me.c_str(), engine.tables().size(), job.c.num_ps(),
                      strategies::to_string(engine.table_mode()), ring.comm().size(),
                      engine.overlaps() ? ", overlapping backprop" : "");
          std::fflush(stdout);
        }
        const auto at = replica_positions(ring, d, engine.global_step());  // resume
        train_result result;
        ring_run run = run_replicas(s, ring, d, at, net, engine, ro, result);  // run
        // Finish: every rank reports done to the ps before the barrier, so rank 0's shutdown
        // after it finds no rank still to report (a synchronous ps takes a rank that leaves
        // unreported for a lost replica).
        close_ring(*s.session, ring, run, engine, [&job, &engine] {
          engine.guard([&job] { job.ps.mark_done(); });
          engine.agree("the end");  // a ps lost since the last step: every rank recovers or ends here
        });
        if constexpr (adopts_parameters<M>) net.set_parameters(engine.parameters());  // every rank holds rank 0's
        report_ring(ring, d, run, net, engine, ro, result, job.started);
        result.recoveries = recoveries;
        return result;
      } catch (const strategies::lost_ps& e) {  // every rank, at the same step (agreed)
        if (recoveries >= o.max_recoveries)
          throw strategies::lost_ps(e.code(), e.message() + (o.max_recoveries == 0
                                                                 ? "; max_recoveries is 0: the job ends"
                                                                 : "; max_recoveries " + std::to_string(o.max_recoveries) +
                                                                       " reached"));
        lost.emplace(e);
        engine.forget_lost();  // known to every rank now: not the next agreement's
      }
    }  // the session ended (its hooks saw the error) before the recovery
    recover_hybrid_ps(job, ring, o, *lost, recoveries + 1);
  }
}

/// The chief's failure ends the job: its ps tasks are not left serving nobody. After a lost ps
/// (`lost_ps`) the connection to the restarted one is made again first (bounded by the connect
/// timeout); a ps that is gone has nothing left to shut down.
inline void shutdown_ps_after_failure(ps_job& job, bool lost_ps) noexcept {
  try {
    if (lost_ps) job.ps.reconnect();
  } catch (const std::exception&) {  // not back: the others are still shut down below
  }
  try {
    job.ps.shutdown();
  } catch (const std::exception&) {
  }
}

/// A task of a hybrid job: the ps role, or a training task (a ring rank and a ps client).
template <class M, class... Hooks>
train_result train_hybrid(const cluster& c, M& net, const data::dataset& train_set,
                          const strategies::hybrid& strategy, const train_options& o, Hooks... user_hooks) {
  const auto started = train_clock::now();
  check_hybrid_job(c, strategy, o);
  const placement tables_only{.shards = {}, .num_ps = c.num_ps()};  // no dense shard on any ps
  const transport_options transport = ps_transport(c, o);
  if (c.self.job == "ps") return serve_ps(c, tables_only, transport, o, o.ps_threads);
  ps_job job(c, o, {}, tables_only, transport, started);  // connect
  try {
    cluster ring_cluster = c;  // make_communicator may fill in the ranks' addresses
    train_options ring_options = o;  // the ring's own refusal of max_recoveries is a plain ring job's
    ring_options.max_recoveries = 0;
    ring_job ring = connect_ring(ring_cluster, ring_options);
    train_result result = run_hybrid_rank(job, ring, train_set, strategy, net, o, std::move(user_hooks)...);
    if (job.is_chief) shutdown_ps(job);
    return result;
  } catch (const strategies::lost_ps&) {
    if (job.is_chief) shutdown_ps_after_failure(job, /*lost_ps=*/true);
    throw;
  } catch (...) {
    if (job.is_chief) shutdown_ps_after_failure(job, /*lost_ps=*/false);
    throw;
  }
}

}  // namespace dtf::detail
