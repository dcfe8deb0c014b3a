// bench_overlap_rank — one rank of synchronous ring-allreduce training through dtf::train, with
// the allreduce of the gradient buckets overlapped with backprop (--overlap) or after it
// (--nooverlap). benchmarks/overlap.sh runs two of them (on loopback under dtfrun, and in two
// network namespaces joined by a shaped veth pair) beside PyTorch DDP (overlap_peer_ddp.py).
//
//   dtfrun --workers 2 -- build/benchmarks/bench_overlap_rank --hidden 2048,2048 --batch 64 --steps 30 --overlap
//
// The model is an MLP 784-<hidden>-10 (Dense+ReLU per hidden layer, Dense logits), trained with
// Adam (rate 1e-3, no linear scaling) on a synthetic deterministic dataset: 16 batches per rank
// of features uniform in [0, 1) and random labels of 10 classes (splitmix64, fixed seed), so
// every run trains on the same examples. The first --warmup steps are not timed; rank 0 then
// times the next --steps steps (from the end of the last warm-up step to the end of the last
// step, taken in a session hook) and prints
//   RESULT overlap=<0|1> framework=dtf hidden=<h> batch=<b> workers=<n> bucket_mib=<m> threads=<t>
//          steps=<s> samples_per_s=<all ranks' examples per second> step_ms=<ms per step>
//          loss=<the last step's loss, averaged over the ranks: the same with overlap on and off>
// (dtf::train prints its own "RESULT scheme=..." line too, over every step).
#include <dtf/dtf.hpp>

#include "mlp_widths.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;

/// When the timed steps start and end, as a session hook sees them on this rank.
struct step_times {
  std::int64_t warmup = 0;
  std::int64_t first = -1, last = -1;  // global steps at t0 and t1
  clock_type::time_point t0, t1;
};

/// Stamps the end of every step; the end of step `warmup` starts the clock.
struct timing_hook {
  std::shared_ptr<step_times> t;
  void after_run(dtf::run_context& ctx, const dtf::run_values&) {
    const auto now = clock_type::now();
    const std::int64_t s = ctx.global_step();
    if (t->first < 0 && s >= t->warmup) {
      t->first = s;
      t->t0 = now;
    }
    t->last = s;
    t->t1 = now;
  }
};
static_assert(dtf::session_hook<timing_hook>);

/// `rows` examples: features uniform in [0, 1), labels uniform over `classes`, from `seed`.
dtf::data::dataset synthetic(std::size_t rows, std::size_t features, std::size_t classes, std::uint64_t seed) {
  xt::xtensor<float, 2> x = xt::xtensor<float, 2>::from_shape({rows, features});
  xt::xtensor<std::int32_t, 1> y = xt::xtensor<std::int32_t, 1>::from_shape({rows});
  dtf::nn::splitmix64 rng(seed);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < features; ++j) x(i, j) = float(rng.uniform());
    y(i) = std::int32_t(rng() % std::uint64_t(classes));
  }
  return dtf::data::dataset(std::move(x), std::move(y), 0.0f, 1.0f);
}
}  // namespace

int main(int argc, char** argv) try {
  using namespace dtf;
  train_flags tf;
  std::string hidden = "2048,2048";
  int batch = 64, steps = 30, warmup = 5, threads = 1;
  double bucket_mib = 4;
  bool overlap = true;
  const int inputs = 784, classes = 10;
  flag_parser flags(
      "One rank of ring-allreduce training of an MLP on synthetic data, with or without overlap of the allreduce "
      "with backprop (benchmarks/overlap.sh). Run two under dtfrun --workers 2, or give each its cluster flags.");
  tf.add_to(flags, train_flag_set::collective);
  flags.add("hidden", hidden, "hidden layer widths, comma-separated")
      .add("steps", steps, "timed steps (after --warmup steps)")
      .add("warmup", warmup, "steps before the timed ones")
      .add("overlap", overlap, "allreduce gradient buckets while backprop runs; --nooverlap: after it")
      .add("bucket_mib", bucket_mib, "fusion bucket size in MiB")
      .add("threads", threads, "BLAS threads per rank");
  // --batch is train_flags' own (examples per rank and step); its default here is 64.
  tf.train.batch = std::size_t(batch);
  if (!flags.parse(argc, argv)) return 0;
  if (steps < 1 || warmup < 1 || threads < 1 || bucket_mib <= 0)
    throw error(errc::invalid_config, "--steps, --warmup, --threads and --bucket_mib must be positive");
  tf.blas_threads = threads;
  const cluster c = tf.resolve_cluster();
  set_cpu_threads({.device = 1, .blas = threads});
  batch = int(tf.train.batch);

  auto net = bench::mlp(bench::layer_widths(std::size_t(inputs), hidden, std::size_t(classes)));

  const std::size_t workers = std::max<std::size_t>(1, num_trainers(c));
  const auto data = synthetic(workers * std::size_t(batch) * 16, std::size_t(inputs), std::size_t(classes), 7);

  strategies::ring_allreduce_config config;
  config.rule = optim::adam{.learning_rate = 1e-3f};
  config.linear_scaling = false;
  config.overlap = overlap;
  config.bucket_bytes = std::size_t(bucket_mib * double(1u << 20));

  auto options = tf.options(c, "overlap_bench");
  options.num_steps = std::int64_t(warmup) + std::int64_t(steps);
  options.last_step = 0;
  options.log_every = 1 << 30;
  options.summary_every = 0;
  options.save_checkpoints_secs = 0;
  options.model_dir.clear();

  auto times = std::make_shared<step_times>();
  times->warmup = warmup;
  const auto r = dtf::train(c, net, data, strategies::ring_allreduce<>(config), options,
                            partitioners::greedy_load_balancing{}, timing_hook{times});
  if (c.is_chief() || c.spec.jobs.empty()) {
    const std::int64_t timed = times->last - times->first;
    if (timed < 1) throw error(errc::internal, "no timed steps (training stopped during the warm-up)");
    const double s = std::chrono::duration<double>(times->t1 - times->t0).count();
    std::printf(
        "RESULT overlap=%d framework=dtf hidden=%s batch=%d workers=%zu bucket_mib=%g threads=%d steps=%lld "
        "samples_per_s=%.1f step_ms=%.2f loss=%.9g\n",
        overlap ? 1 : 0, hidden.c_str(), batch, workers, bucket_mib, threads, static_cast<long long>(timed),
        double(timed) * double(batch) * double(workers) / s, 1e3 * s / double(timed), r.loss);
    std::fflush(stdout);
  }
  return r.exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_overlap_rank: %s\n", e.what());
  return 2;
}
