// mirrored — R replicas of the Fashion-MNIST MLP in one process (threads; one per GPU on CUDA
// builds), reduced in shared memory, composed with the ring across processes.
//
//   build/examples/mirrored --replicas 2                                 # one process, 2 replicas
//   dtfrun --workers 2 -- build/examples/mirrored --replicas 2           # 2 processes x 2 replicas
//   mpirun -np 2 --oversubscribe build/examples/mirrored --replicas 2 --rendezvous 127.0.0.1:29500
//
// Rank 0 evaluates after every epoch, prints the RESULT line and writes --metrics_file.
// Training runs in the standard session (../common/hooks.hpp, collective_session): progress
// lines (step= last_step= loss= steps_per_sec= learning_rate=), --last_step/--num_steps,
// --nan_policy, SIGTERM/SIGINT as a stop on every rank, and with --model_dir TensorBoard
// summaries and checkpoints by rank 0; rerunning with the same --model_dir resumes.
#include <dtf/cluster.hpp>
#include <dtf/collectives.hpp>
#include <dtf/dtf.hpp>
#include <dtf/strategies/mirrored.hpp>

#include "../common/hooks.hpp"
#include "../common/mlp.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
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

bool has_cluster(const dtf::cluster_flags& cf) {
  for (const char* v : {"TF_CONFIG", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return !cf.job_name.empty();
}

}  // namespace

int main(int argc, char** argv) try {
  using clock = std::chrono::steady_clock;
  const auto started = clock::now();
  dtf::cluster_flags cf;
  cf.num_ps = 0;
  std::string data_dir = dtf::data::fashion_mnist_default_dir, optimizer = "adam", secret, metrics_file;
  int replicas = 2, epochs = 5, batch = 64, log_every = 200, train_examples = 0, timeout_ms = 60000, warmup_steps = 100;
  bool linear_scaling = true;
  float lr = 1e-3f, target_accuracy = 0.0f;
  std::uint64_t seed = 42;
  dtf::flag_parser flags(
      "Trains the Fashion-MNIST MLP with R mirrored replicas per process (threads), allreduced across processes "
      "(alone, under dtfrun --workers N, or under mpirun -np N with --rendezvous host:port).");
  examples::hook_flags hf;
  dtf::add_cluster_flags(flags, cf);
  hf.add_to(flags, false, false);
  flags.add("replicas", replicas, "model replicas (threads) in this process")
      .add("data", data_dir, "directory holding the Fashion-MNIST IDX files")
      .add("epochs", epochs, "passes over each replica's shard of the training set")
      .add("batch", batch, "examples per replica and step")
      .add("optimizer", optimizer, "sgd, momentum, nesterov, adagrad or adam")
      .add("lr", lr, "base learning rate (for one replica's batch)")
      .add("linear_scaling", linear_scaling, "scale the rate by the replicas in all; --nolinear_scaling: off")
      .add("warmup_steps", warmup_steps, "ramp from lr to replicas*lr over this many steps (with --linear_scaling)")
      .add("seed", seed, "seed for initialisation and shuffling")
      .add("secret", secret, "cluster secret (default: $DTF_CLUSTER_SECRET; empty: no authentication)")
      .add("timeout_ms", timeout_ms, "longest wait without progress inside a collective or a replica barrier")
      .add("log_every", log_every, "steps between progress lines")
      .add("train_examples", train_examples, "use only the first N training examples (0: all)")
      .add("metrics_file", metrics_file, "chief: write the final metrics as JSON here")
      .add("target_accuracy", target_accuracy, "chief: exit with status 1 if the final test accuracy is lower");
  if (!flags.parse(argc, argv)) return 0;
  if (replicas < 1) throw dtf::error(dtf::errc::invalid_config, "--replicas " + std::to_string(replicas) + " < 1");
  dtf::set_cpu_threads({.device = 1, .blas = 1});
  if (secret.empty())
    if (const char* s = std::getenv("DTF_CLUSTER_SECRET")) secret = s;

  dtf::collective_options options;
  options.secret = secret;
  options.timeout_ms = std::uint32_t(timeout_ms);
  std::optional<dtf::communicator> comm_storage;
  std::string me = "local", source = "none";
  if (has_cluster(cf)) {
    dtf::cluster cluster = dtf::resolve_cluster(cf);
    options.cluster_id = cluster.id();
    me = cluster.self.str();
    source = cluster.source;
    comm_storage.emplace(dtf::make_communicator(cluster, options));
  } else {
    comm_storage.emplace(dtf::communicator::single(options));
  }
  dtf::communicator& comm = *comm_storage;
  const std::size_t rank = comm.rank(), r = std::size_t(replicas), global = r * comm.size();

  auto train_all = dtf::data::load_fashion_mnist(dtf::data::split::train, data_dir);
  if (train_examples > 0) train_all = train_all.take(std::size_t(train_examples));
  const auto test = dtf::data::load_fashion_mnist(dtf::data::split::test, data_dir).normalize().batch(1000);
  std::size_t per_epoch = SIZE_MAX;
  for (std::size_t g = 0; g < global; ++g)
    per_epoch = std::min(per_epoch, train_all.shard(global, g).batch(std::size_t(batch)).batches_per_epoch());
  const std::int64_t last_step = std::int64_t(epochs) * std::int64_t(per_epoch);
  struct stream_of {  // batch streams neither copy nor move: build them in place
    explicit stream_of(const dtf::data::dataset& d) : s(d.stream()) {}
    dtf::data::batch_stream s;
  };
  std::deque<stream_of> streams;
  std::vector<dtf::data::dataset> shards;
  for (std::size_t k = 0; k < r; ++k) {
    const std::size_t g = rank * r + k;
    shards.push_back(train_all.shard(global, g).shuffle(seed + g).normalize().batch(std::size_t(batch)).repeat(-1).prefetch(2));
  }
  for (auto& s : shards) streams.emplace_back(s);

  dtf::strategies::mirrored<dtf::nn::sequential> strategy(
      comm, examples::make_mlp(), r,
      {.rule = dtf::optim::make_rule(optimizer, lr), .linear_scaling = linear_scaling, .warmup_steps = warmup_steps,
       .timeout_ms = std::uint32_t(timeout_ms)});
  strategy.initialize(seed);
  examples::collective_session session(strategy, comm, strategy.model(0).variables(), hf, me, log_every, last_step);
  session->create();  // resumes from --model_dir's latest checkpoint
  if (rank == 0)
    std::printf("%s: mirrored with %zu replicas x %zu processes (source %s), batch %d per replica; %lld steps\n",
                me.c_str(), r, comm.size(), source.c_str(), batch, static_cast<long long>(last_step));
  std::fflush(stdout);

  const auto t0 = clock::now();
  const std::int64_t first_step = strategy.global_step();
  dtf::nn::evaluation eval{};
  std::int64_t evaluated_at = -1;
  auto evaluate = [&](const std::string& label) {
    eval = dtf::nn::evaluate(strategy.model(0), strategy.parameters(0), test);
    evaluated_at = strategy.global_step();
    std::printf("%s: %s  test_loss %.4f  test_accuracy %.4f\n", me.c_str(), label.c_str(), eval.loss, eval.accuracy);
    std::fflush(stdout);
  };
  std::vector<dtf::data::host_batch> batches(r);
  while (!session->should_stop()) {
    std::size_t examples = 0;
    for (std::size_t k = 0; k < r; ++k) {
      batches[k] = *streams[k].s.next();
      examples += batches[k].labels.size();
    }
    session.run(examples, [&] { return strategy.step(batches); });
    const std::int64_t step = strategy.global_step();
    if (rank == 0 && step % std::int64_t(per_epoch) == 0 && step != evaluated_at)
      evaluate("epoch " + std::to_string(step / std::int64_t(per_epoch)));
  }
  session->close();
  const double train_s = std::chrono::duration<double>(clock::now() - t0).count();
  const std::int64_t final_step = strategy.global_step(), trained = std::max<std::int64_t>(1, final_step - first_step);
  comm.barrier();
  if (rank != 0) return 0;
  // Stopped part-way through an epoch (--last_step, --num_steps, a signal): evaluate what was trained.
  if (evaluated_at != final_step) evaluate("stopped at step " + std::to_string(final_step));
  const double wall = std::chrono::duration<double>(clock::now() - started).count();
  std::printf("%s: final test accuracy %.4f  test_loss %.4f  global_step %lld  wall %.1fs\n", me.c_str(), eval.accuracy,
              eval.loss, static_cast<long long>(final_step), wall);
  std::printf("RESULT scheme=mirrored workers=%zu replicas=%zu accuracy=%.4f wall_s=%.1f step_ms=%.2f samples_per_s=%.0f\n",
              comm.size(), r, eval.accuracy, wall, 1e3 * train_s / double(trained),
              double(trained) * double(batch) * double(global) / train_s);
  std::fflush(stdout);
  write_metrics(metrics_file, eval.accuracy, eval.loss, final_step, wall);
  if (eval.accuracy < target_accuracy) {
    std::fprintf(stderr, "%s: test accuracy %.4f is below the target %.4f\n", me.c_str(), eval.accuracy,
                 double(target_accuracy));
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "mirrored: %s\n", e.what());
  return 2;
}
