// distributed_setup — the same binary runs as a parameter server or as a worker (the chief is
// worker 0 unless the cluster has a chief task) and trains the Fashion-MNIST MLP through the
// parameter servers: each step a worker pulls the parameters, computes gradients on its shard
// of the data and pushes them; the ps applies the update rule (Adam by default). When the
// chief is done it waits for every worker, evaluates, tells the parameter servers to shut
// down, and they exit 0.
//
// Training runs inside the standard monitored session (../common/hooks.hpp): --model_dir
// (resume from the latest checkpoint, checkpoints, TensorBoard summaries), --last_step /
// --num_steps, --nan_policy, --max_recoveries, progress lines with dtfrun's key=value tokens,
// and SIGTERM/SIGINT as a stop request.
//
//   dtfrun --ps 1 --workers 1 -- build/examples/distributed_setup
//   dtfrun --ps 1 --workers 2 -- build/examples/distributed_setup --model_dir run1   # rerun: resumes
//   build/examples/distributed_setup --job_name ps --task_index 0 --ps_hosts h0:2222 --worker_hosts h1:2222
#include "../common/hooks.hpp"
#include "../common/job.hpp"

#include <cstdio>

namespace {

// Host buffers for pull/push: the device tensors themselves on CPU builds, a staging copy on
// CUDA builds.
struct host_mirror {
  dtf::tensor& dev;
  std::vector<float> staging;
  explicit host_mirror(dtf::tensor& t) : dev(t) {
    if constexpr (!dtf::device_memory_is_host_accessible) staging.resize(t.size());
  }
  std::span<float> host() {
    if constexpr (dtf::device_memory_is_host_accessible) return dev.span<float>();
    return staging;
  }
  void to_device() {
    if constexpr (!dtf::device_memory_is_host_accessible) dev.copy_from_host<float>(staging);
  }
  void to_host() {
    if constexpr (!dtf::device_memory_is_host_accessible) dev.copy_to_host<float>(std::span<float>(staging));
  }
};

}  // namespace

int main(int argc, char** argv) try {
  using namespace dtf;
  std::string optimizer = "adam";
  float lr = 1e-3f;
  int ps_threads = 1;
  examples::hook_flags hf;
  auto j = examples::job::setup(
      argc, argv, "distributed_setup",
      [&](flag_parser& f) {
        hf.add_to(f);
        f.add("lr", lr, "learning rate of the update rule the ps applies")
            .add("optimizer", optimizer, "update rule on the ps: sgd, momentum, nesterov, adagrad or adam")
            .add("ps_threads", ps_threads, "I/O threads of a ps");
      },
      {.epochs = 5, .batch = 64, .learning_rate = [&lr](std::int64_t, std::size_t) { return double(lr); }});
  if (!j) return 0;
  if (j->is_ps()) {
    j->ps_threads = ps_threads;
    return j->run_ps();
  }
  hf.validate();
  const optim::rule rule = optim::make_rule(optimizer, lr);
  const auto client = j->connect();
  auto& ps = *client;
  const std::string me = j->me();

  const std::size_t n = j->net.num_parameters();
  tensor params({n}), grads({n}), x, y;
  host_mirror hp(params), hg(grads);
  examples::standard_session session(*j, ps, hf, {
      .init = [&] {
        j->net.initialize(params.span<float>(), j->seed);
        hp.to_host();
        ps.initialize(hp.host(), rule);
        std::printf("%s: initialised %zu parameters on %zu ps (%zu shards), rule %s lr %g\n", me.c_str(), n,
                    j->cluster.num_ps(), j->layout.shards.size(), optimizer.c_str(), double(lr));
      },
      .ps_rule = rule});
  session->create();
  if (j->is_chief() && session->global_step() > 0)
    std::printf("%s: resumed from the checkpoint at global step %lld\n", me.c_str(),
                static_cast<long long>(session->global_step()));
  const auto train = j->train_shard(j->epochs);
  std::printf("%s: training on shard %zu of %zu (%zu examples), %d epochs\n", me.c_str(), j->trainer, j->trainers,
              train.size(), j->epochs);
  std::fflush(stdout);
  const auto vars = j->net.variables();
  std::size_t steps = 0;
  auto stream = train.stream();
  while (!session->should_stop()) {
    auto b = stream.next();
    if (!b) break;
    session->run([&](run_context& ctx) {
      run_values v;
      assign_from_host(x, b->features);
      assign_from_host(y, b->labels);
      // One step: pull θ, gradients on this batch, push them (the ps applies its rule). Retried
      // whole after a lost ps when --max_recoveries allows.
      const auto [loss, global_step] = session.recoverable([&] {
        ps.pull(hp.host());
        hp.to_device();
        const float l = j->net.loss_and_gradients(params.span<float>(), x, y, grads.span<float>());
        hg.to_host();
        return std::pair{l, ps.push_gradients(hg.host()).global_step};
      });
      v.loss = loss;
      v.global_step = std::max(global_step, ctx.global_step());
      v.examples = b->labels.size();
      v.scalars["learning_rate"] = double(lr);
      examples::standard_session::add_variables(ctx, vars, hp.host(), v);
      return v;
    });
    ++steps;
    if (j->is_chief() && b->index + 1 == train.batches_per_epoch())
      session.recoverable([&] { j->log_epoch(ps, b->epoch + 1); });
  }
  session->close();
  std::printf("%s: done after %zu steps\n", me.c_str(), steps);
  std::fflush(stdout);
  if (examples::standard_session::stopped_by_signal()) j->wait_for_workers = false;
  const int rc = session.recoverable([&] { return j->finish(ps, "optimizer=" + optimizer); });
  if (j->is_chief()) {
    std::printf("%s: parameter servers shut down\n", me.c_str());
    std::fflush(stdout);
  }
  return rc;
} catch (const std::exception& e) {
  std::fprintf(stderr, "distributed_setup: %s\n", e.what());
  return 2;
}
