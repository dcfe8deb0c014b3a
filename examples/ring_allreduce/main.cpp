// ring_allreduce — synchronous data-parallel training of the Fashion-MNIST MLP without
// parameter servers: every worker computes gradients on its shard, the gradients are averaged
// with a ring allreduce, and every worker applies the same Adam step (Horovod's scheme).
//
//   dtfrun --workers 2 -- build/examples/ring_allreduce
//   mpirun -np 2 --oversubscribe build/examples/ring_allreduce --rendezvous 127.0.0.1:29500
//
// Rank 0 (the chief) evaluates on the test set after every epoch, prints the RESULT line and
// writes --metrics_file. Training runs in the standard session (../common/hooks.hpp,
// collective_session): progress lines (step= last_step= loss= steps_per_sec= learning_rate=)
// from the logging hook, --last_step/--num_steps, --nan_policy, SIGTERM/SIGINT as a stop on
// every rank, and with --model_dir TensorBoard summaries and checkpoints by rank 0; rerunning
// with the same --model_dir resumes every rank from the latest checkpoint.
#include <dtf/cluster.hpp>
#include <dtf/collectives.hpp>
#include <dtf/dtf.hpp>
#include <dtf/strategies/ring_allreduce.hpp>

#include "../common/hooks.hpp"
#include "../common/mlp.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

/// Writes {"accuracy":…, "loss":…, "global_step":…, "wall_s":…} atomically (temp + rename).
void write_metrics(const std::string& path, double accuracy, double loss, std::int64_t step, double wall_s) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "{\"accuracy\": " << accuracy << ", \"loss\": " << loss << ", \"global_step\": " << step
        << ", \"wall_s\": " << wall_s << "}\n";
    out.flush();
    if (!out) throw dtf::error(dtf::errc::io_error, "--metrics_file: cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

int main(int argc, char** argv) try {
  using clock = std::chrono::steady_clock;
  const auto started = clock::now();
  dtf::cluster_flags cf;
  cf.num_ps = 0;  // under mpirun or srun every rank trains
  std::string data_dir = dtf::data::fashion_mnist_default_dir, optimizer = "adam", secret, metrics_file;
  int epochs = 5, batch = 64, log_every = 200, train_examples = 0, blas_threads = 1, timeout_ms = 60000,
      warmup_steps = 100;
  int segment_kib = 256;
  bool linear_scaling = true;
  float lr = 1e-3f, target_accuracy = 0.0f;
  std::uint64_t seed = 42;
  dtf::flag_parser flags(
      "Trains the Fashion-MNIST MLP with ring-allreduce (run one process per worker: dtfrun --workers N, or "
      "mpirun -np N with --rendezvous host:port).");
  examples::hook_flags hf;
  dtf::add_cluster_flags(flags, cf);
  hf.add_to(flags, false, false);
  flags.add("data", data_dir, "directory holding the Fashion-MNIST IDX files")
      .add("epochs", epochs, "passes over each worker's shard of the training set")
      .add("batch", batch, "examples per worker and step")
      .add("optimizer", optimizer, "sgd, momentum, nesterov, adagrad or adam")
      .add("lr", lr, "base learning rate (for one worker's batch)")
      .add("linear_scaling", linear_scaling, "scale the rate by the number of workers; --nolinear_scaling: off")
      .add("warmup_steps", warmup_steps, "ramp from lr to workers*lr over this many steps (with --linear_scaling)")
      .add("seed", seed, "seed for initialisation and shuffling")
      .add("secret", secret, "cluster secret (default: $DTF_CLUSTER_SECRET; empty: no authentication)")
      .add("timeout_ms", timeout_ms, "longest wait without progress inside a collective")
      .add("segment_kib", segment_kib, "allreduce segment size in KiB")
      .add("log_every", log_every, "steps between progress lines")
      .add("train_examples", train_examples, "use only the first N training examples (0: all)")
      .add("blas_threads", blas_threads, "BLAS threads per process")
      .add("metrics_file", metrics_file, "chief: write the final metrics as JSON here")
      .add("target_accuracy", target_accuracy, "chief: exit with status 1 if the final test accuracy is lower");
  if (!flags.parse(argc, argv)) return 0;
  dtf::set_cpu_threads({.device = 1, .blas = blas_threads});
  if (secret.empty())
    if (const char* s = std::getenv("DTF_CLUSTER_SECRET")) secret = s;

  dtf::cluster cluster = dtf::resolve_cluster(cf);
  const std::string me = cluster.self.str();
  dtf::collective_options options;
  options.cluster_id = cluster.id();
  options.secret = secret;
  options.timeout_ms = std::uint32_t(timeout_ms);
  options.segment_bytes = std::size_t(segment_kib) * 1024;
  dtf::communicator comm = dtf::make_communicator(cluster, options);
  const std::size_t rank = comm.rank(), ranks = comm.size();

  auto train_all = dtf::data::load_fashion_mnist(dtf::data::split::train, data_dir);
  if (train_examples > 0) train_all = train_all.take(std::size_t(train_examples));
  const auto test = dtf::data::load_fashion_mnist(dtf::data::split::test, data_dir).normalize().batch(1000);
  // Every rank runs the same number of steps: the smallest shard's batches per epoch.
  std::size_t per_epoch = SIZE_MAX;
  for (std::size_t r = 0; r < ranks; ++r)
    per_epoch = std::min(per_epoch, train_all.shard(ranks, r).batch(std::size_t(batch)).batches_per_epoch());
  const std::int64_t last_step = std::int64_t(epochs) * std::int64_t(per_epoch);
  const auto train =
      train_all.shard(ranks, rank).shuffle(seed + rank).normalize().batch(std::size_t(batch)).repeat(-1).prefetch(2);

  auto net = examples::make_mlp();
  dtf::strategies::ring_allreduce<dtf::nn::sequential> strategy(
      comm, net, {.rule = dtf::optim::make_rule(optimizer, lr), .linear_scaling = linear_scaling,
                  .warmup_steps = warmup_steps});
  strategy.initialize(seed);
  examples::collective_session session(strategy, comm, net.variables(), hf, me, log_every, last_step);
  session->create();  // resumes from --model_dir's latest checkpoint
  if (rank == 0)
    std::printf("%s: ring_allreduce with %zu workers (source %s), %zu parameters, batch %d per worker; %lld steps\n",
                me.c_str(), ranks, cluster.source.c_str(), net.num_parameters(), batch,
                static_cast<long long>(last_step));
  std::fflush(stdout);

  auto stream = train.stream();
  const auto t0 = clock::now();
  const std::int64_t first_step = strategy.global_step();
  dtf::nn::evaluation eval{};
  std::int64_t evaluated_at = -1;
  auto evaluate = [&](const std::string& label) {
    eval = dtf::nn::evaluate(net, strategy.parameters(), test);
    evaluated_at = strategy.global_step();
    std::printf("%s: %s  test_loss %.4f  test_accuracy %.4f\n", me.c_str(), label.c_str(), eval.loss, eval.accuracy);
    std::fflush(stdout);
  };
  while (!session->should_stop()) {
    auto b = stream.next();
    session.run(b->labels.size(), [&] { return strategy.step(*b); });
    const std::int64_t step = strategy.global_step();
    if (rank == 0 && step % std::int64_t(per_epoch) == 0 && step != evaluated_at)
      evaluate("epoch " + std::to_string(step / std::int64_t(per_epoch)));
  }
  session->close();
  const double train_s = std::chrono::duration<double>(clock::now() - t0).count();
  const std::int64_t final_step = strategy.global_step(), trained = std::max<std::int64_t>(1, final_step - first_step);
  comm.barrier();  // nobody leaves while another still needs its connections
  if (rank != 0) return 0;
  // Stopped part-way through an epoch (--last_step, --num_steps, a signal): evaluate what was trained.
  if (evaluated_at != final_step) evaluate("stopped at step " + std::to_string(final_step));
  const double wall = std::chrono::duration<double>(clock::now() - started).count();
  std::printf("%s: final test accuracy %.4f  test_loss %.4f  global_step %lld  wall %.1fs\n", me.c_str(), eval.accuracy,
              eval.loss, static_cast<long long>(final_step), wall);
  std::printf("RESULT scheme=ring_allreduce workers=%zu accuracy=%.4f wall_s=%.1f step_ms=%.2f samples_per_s=%.0f\n",
              ranks, eval.accuracy, wall, 1e3 * train_s / double(trained),
              double(trained) * double(batch) * double(ranks) / train_s);
  std::fflush(stdout);
  write_metrics(metrics_file, eval.accuracy, eval.loss, final_step, wall);
  if (eval.accuracy < target_accuracy) {
    std::fprintf(stderr, "%s: test accuracy %.4f is below the target %.4f\n", me.c_str(), eval.accuracy,
                 double(target_accuracy));
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ring_allreduce: %s\n", e.what());
  return 2;
}
