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
// (dtf/recovery.hpp; the chief re-initialises it from the latest checkpoint); a hybrid job's
// ranks agree on the loss and rewind together to the latest checkpoint (dtf/train/hybrid.hpp).
// A restarted task (ps strategies) redoes no work: every task reports its data position to ps 0
// after each step (position_every), checkpoints carry the positions, and a task started into a
// running job resumes its shard at its own (dtf/ps/positions.hpp; its epochs count those done).
//
// The RESULT line (chief) is machine-readable for benchmarks/:
//   RESULT scheme=<name> workers=<n> accuracy=<a> wall_s=<s> <kind-specific key=value ...>
// The partitioner (ps strategies) and the caller's own hooks are policy types chosen in the
// same call: train(cluster, net, data, strategy, options, partitioner, hook1, hook2, ...).
//
// Errors: a bad option is dtf::error(errc::invalid_config) naming it; errors of the transport,
// the ps, the communicator and the checkpoints propagate (as exceptions) from this task.
//
// Layout: dtf/train/options.hpp (train_options, train_result, evaluate_on), report.hpp (hooks,
// RESULT line, metrics file), ps_job.hpp (the phases of a ps job's tasks that do not depend on
// the strategy: the ps role, connect, initialise or restore, data position, finish),
// through_ps.hpp (the ps strategies' workers and chief through those phases), collective.hpp
// (a rank of a collective strategy, in phases: connect, replicas, initialise or restore,
// resume, run, finish), hybrid.hpp (dtf::strategies::hybrid: the tables on the ps, the dense
// variables on the ring, through the phases of both); this header holds the entry point.
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/session.hpp>
#include <dtf/train/collective.hpp>
#include <dtf/train/hybrid.hpp>
#include <dtf/train/options.hpp>
#include <dtf/train/through_ps.hpp>

namespace dtf {

/// Runs this task's part of the job (see the file comment). `train_set`: the whole training
/// set (train shards it over the training tasks); `net`: the model (a collective strategy's
/// replicas copy it); `strategy`: a value modelling dtf::strategy; `partitioner`: places the
/// variables on the ps tasks (ps strategies); `user_hooks`: session hooks added after the
/// standard ones. Returns this task's result; result.exit_code is the process's exit status.
template <class S, class M, class P = partitioners::greedy_load_balancing, class... Hooks>
train_result train(const cluster& c, M& net, const data::dataset& train_set, S strategy, const train_options& o,
                   P layout_policy = {}, Hooks... user_hooks) {
  static_assert(check_strategy<S>(), "dtf::train: the strategy does not model dtf::strategy (see the message above)");
  if constexpr (embedding_model<M> && S::kind == strategy_kind::collective)
    static_assert(!embedding_model<M>,
                  "dtf::train: an embedding model (tables on the ps) does not train with ring_allreduce or mirrored, "
                  "which hold the whole model on every rank: use dtf::strategies::hybrid (the tables on the ps, "
                  "the dense variables by ring-allreduce among the workers)");
  else if constexpr (embedding_model<M>)
    static_assert(strategies::trains_tables<S>,
                  "dtf::train: an embedding model (tables on the ps) trains with the asynchronous strategies, "
                  "SyncSGD and dtf::strategies::hybrid: SAGN's local steps would need local copies of the rows");
  else if constexpr (S::kind == strategy_kind::hybrid)
    static_assert(embedding_model<M>,
                  "dtf::train: dtf::strategies::hybrid trains an embedding model (tables for the ps to hold); a model "
                  "without tables trains with dtf::strategies::ring_allreduce");
  else
    static_assert(check_model<M>(), "dtf::train: the model does not model dtf::model (see the message above)");
  static_assert(dtf::partitioner<P>, "dtf::train: the partitioner needs `p.place(vars, num_ps)` -> dtf::placement");
  static_assert((session_hook<Hooks> && ...), "dtf::train: every hook needs one of begin, after_create_session, "
                                               "before_run, after_run, end (dtf/session.hpp)");
  detail::validate(o);
  if constexpr (embedding_model<M> ? !strategies::trains_tables<S> || S::kind == strategy_kind::collective
                                    : S::kind == strategy_kind::hybrid)
    return {};  // refused above
  else if constexpr (S::kind == strategy_kind::hybrid)
    return detail::train_hybrid(c, net, train_set, strategy, o, std::move(user_hooks)...);
  else if constexpr (S::kind == strategy_kind::collective)
    return detail::train_collective(c, net, train_set, strategy, o, std::move(user_hooks)...);
  else
    return detail::train_through_ps(c, net, train_set, std::move(strategy), o, layout_policy, std::move(user_hooks)...);
}

}  // namespace dtf
