// dtf/train/collective.hpp — dtf::train's role for a collective strategy (ring-allreduce,
// mirrored): a rank with no ps, its replicas' batches (resumed where the restored global step
// puts them), the engine's steps, agreed stops and the rank-0 checkpoints. See dtf/train.hpp
// for the whole picture.
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
#include <dtf/train/report.hpp>
#include <dtf/train/resume.hpp>
#include <dtf/transport/credentials.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtf::detail {

/// Rank 0's line on a resumed run: where the replicas' shards resume (runs of consecutive
/// replicas at the same place share one entry) and the examples trained before, over all.
inline std::string resumed_positions(const std::string& me, std::uint64_t step, const std::vector<data::position>& at) {
  std::uint64_t examples = 0;
  for (const auto& p : at) examples += p.examples;
  std::string line = me + ": resuming from global step " + std::to_string(step) + " (" + std::to_string(examples) +
                     " examples trained before, over " + std::to_string(at.size()) +
                     (at.size() == 1 ? " replica): " : " replicas): ");
  auto place = [](const data::position& p) {
    return "epoch " + std::to_string(p.epoch) + ", batch " + std::to_string(p.batch);
  };
  for (std::size_t first = 0; first < at.size();) {
    std::size_t last = first;
    auto same = [&](const data::position& p) { return p.epoch == at[first].epoch && p.batch == at[first].batch; };
    while (last + 1 < at.size() && same(at[last + 1])) ++last;
    if (first > 0) line += "; ";
    if (first == 0 && last + 1 == at.size())
      line += "each replica's shard at ";
    else if (first == last)
      line += "replica " + std::to_string(first) + " at ";
    else
      line += "replicas " + std::to_string(first) + "-" + std::to_string(last) + " at ";
    line += place(at[first]);
    first = last + 1;
  }
  return line;
}

/// A rank of a collective strategy.
template <class S, class M, class... Hooks>
train_result train_collective(cluster c, M& net, const data::dataset& train_set, const S& strategy,
                              const train_options& o, Hooks... user_hooks) {
  const auto started = train_clock::now();
  if (o.max_recoveries > 0)
    throw error(errc::invalid_config, "max_recoveries: a collective strategy has no parameter server");
  collective_options options;
  options.secret = !o.ring_key.empty() ? o.ring_key : o.secret.empty() ? std::string() : derive_ring_key(o.secret);
  options.tls = o.tls;  // every ring connection inside TLS 1.3 (errc::invalid_config without a secret)
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
  // Each replica's own shard starts as a data position (its layout, the start); a resumed run
  // moves them all on by the restored global step (below).
  std::size_t per_epoch = SIZE_MAX;
  std::vector<data::position> starts(global);
  std::vector<std::uint64_t> batches_per_epoch(global);
  for (std::size_t g = 0; g < global; ++g) {
    const auto shard = train_set.shard(global, g).batch(o.batch);
    batches_per_epoch[g] = shard.batches_per_epoch();
    per_epoch = std::min(per_epoch, shard.batches_per_epoch());
    starts[g] = data::position::start_of(global, shard.size(), o.batch, o.seed + g);
  }
  const std::int64_t epochs_last_step = std::int64_t(o.epochs) * std::int64_t(per_epoch);
  std::vector<data::dataset> shards;
  for (std::size_t k = 0; k < r; ++k) {
    const std::size_t g = comm.rank() * r + k;
    shards.push_back(train_set.shard(global, g).shuffle(o.seed + g).batch(o.batch).repeat(-1).prefetch(2));
  }

  auto engine = strategy.make(comm, net);
  engine.initialize(o.seed);
  const auto vars = net.variables();
  const bool is_chief = comm.rank() == 0;
  // Rank 0 refuses a checkpoint whose step this configuration never reaches (dtf/train/resume.hpp).
  const run_end end{
      .last_step = o.num_steps > 0 ? std::nullopt : std::optional(o.last_step > 0 ? o.last_step : epochs_last_step),
      .num_steps = o.num_steps,
      .what = o.last_step > 0 ? "--last_step" : "--epochs " + std::to_string(o.epochs)};
  std::string restored;  // "checkpoint NAME of DIR" on rank 0, once restored
  session_scaffold scaffold =
      hooks::collective_scaffold(comm, o.model_dir, vars, engine, me, [&](const checkpoint_manifest& man) {
        restored = "checkpoint " + man.name + " of " + o.model_dir;
        (void)check_start_step(man.global_step, end, restored);
      });
  if constexpr (has_buffers<M>) {
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
  monitored_training_session session({.is_chief = is_chief, .scaffold = std::move(scaffold)});
  hooks::stop_on_signal signals(session, /*direct=*/false);
  // num_steps: N more steps from wherever this run starts (a resumed run included).
  std::shared_ptr<summary_writer> writer =
      add_standard_hooks(session, o, o.num_steps > 0 ? std::nullopt : std::optional(epochs_last_step), me, is_chief);
  if (!o.model_dir.empty()) {
    const checkpoint_options ck{.directory = o.model_dir, .max_to_keep = std::size_t(o.keep_checkpoints)};
    session.add_chief_hook(hooks::checkpoint_saver(
        [&, ck](std::int64_t step) {
          take_replica_buffers(net, engine);  // the job's buffers are rank 0's replica 0's
          save_buffers(net, ck.directory, ck.prefix + "-" + std::to_string(step));
          return hooks::save_replicated(ck, vars, engine, step);
        },
        {.every_n_steps = o.save_checkpoints_steps, .every_secs = o.save_checkpoints_secs}));
  }
  (session.add_hook(std::move(user_hooks)), ...);
  session.add_hook(hooks::agreed_stop{&comm});  // last: sees every other hook's stop request
  session.create();  // resumes from model_dir's latest checkpoint
  const std::int64_t last_step = o.last_step > 0 ? o.last_step : epochs_last_step;
  // Every rank says so when it starts at or past its end (its restore checked the step).
  const std::int64_t start = engine.global_step();
  const std::string from = !restored.empty() ? restored : start > 0 ? "restored from " + o.model_dir : "a fresh start";
  if (const auto line = check_start_step(start, end, from); !line.empty()) {
    std::printf("%s: %s\n", me.c_str(), line.c_str());
    std::fflush(stdout);
  }
  if (is_chief) {
    std::printf("%s: %s with %zu replicas x %zu processes (source %s%s), %zu parameters, batch %zu per replica; %lld "
                "steps\n",
                me.c_str(), o.name.c_str(), r, comm.size(), source.c_str(),
                o.tls && comm.size() > 1 ? ", ring inside TLS 1.3" : "", num_parameters(vars), o.batch,
                static_cast<long long>(last_step));
    std::fflush(stdout);
  }
  // Restarts redo no work: every replica trains exactly one batch of its endless stream per
  // global step, so after a restore to step S replica g is S batches into its shard, at epoch
  // S / its own batches per epoch (shards may differ by one example, and so by one batch).
  const auto restored_step = std::uint64_t(std::max<std::int64_t>(0, engine.global_step()));
  std::vector<data::position> at(global);
  for (std::size_t g = 0; g < global; ++g) at[g] = starts[g].after(restored_step, batches_per_epoch[g]);
  if (is_chief && restored_step > 0) {
    std::printf("%s\n", resumed_positions(me, restored_step, at).c_str());
    std::fflush(stdout);
  }
  struct stream_of {  // batch streams neither copy nor move: build them in place
    stream_of(const data::dataset& d, const data::position& from) : s(d.stream(from)) {}
    data::batch_stream s;
  };
  std::deque<stream_of> streams;
  for (std::size_t k = 0; k < r; ++k) streams.emplace_back(shards[k], at[comm.rank() * r + k]);

  train_result result;
  const auto t0 = train_clock::now();
  const std::int64_t first_step = engine.global_step();
  std::optional<nn::evaluation> eval;
  std::int64_t evaluated_at = -1;
  auto report = [&](const std::string& label) {
    if (!o.evaluate) return;
    take_replica_buffers(net, engine);
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
}  // namespace dtf::detail
