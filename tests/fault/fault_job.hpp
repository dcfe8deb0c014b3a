// The fault test's scaffolding (fault_trainer.cpp drives the ps role, recovery and session by
// hand, with crash injection, so it does not use dtf::train): flags, cluster resolution, the ps
// role, the data shard of this worker, evaluation of the centre variable, and the chief's end of
// job (wait for every worker, evaluate, print a RESULT line, shut the parameter servers down).
//
// The RESULT line is machine-readable for the scripts under benchmarks/:
//   RESULT scheme=agn workers=2 accuracy=0.8712 wall_s=12.3 <scheme-specific key=value...>
// With --metrics_file PATH the chief also writes the final figures there as a JSON object
// ({"accuracy": ..., "loss": ..., "global_step": ..., "wall_s": ...}), atomically (a
// temporary file renamed into place), for `dtfrun sweep`.
// Progress lines carry key=value tokens (step=, last_step=, loss=, steps_per_sec=) that
// dtfrun's live view reads.
#pragma once

#include <dtf/cluster.hpp>
#include <dtf/dtf.hpp>
#include <dtf/ps.hpp>

#include "../../examples/common/mlp.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

namespace examples {

struct job_defaults {
  int epochs = 5;
  int batch = 64;
  /// The learning rate at a global step in an epoch of the worker's data, logged and summarised
  /// as "learning_rate" (empty: the example does not report one). May read the example's
  /// flags: it is called after parsing.
  std::function<double(std::int64_t global_step, std::size_t epoch)> learning_rate;
};

class job {
 public:
  using clock = std::chrono::steady_clock;

  /// Parses the command line (the common flags plus those `add_flags` registers). Returns
  /// nullopt when --help was printed.
  static std::optional<job> setup(int argc, char** argv, const char* scheme,
                                  const std::function<void(dtf::flag_parser&)>& add_flags, job_defaults d = {}) {
    job j(scheme, d);
    dtf::flag_parser flags(std::string("Trains the Fashion-MNIST MLP with ") + scheme +
                           " through parameter servers (run one process per task, e.g. under dtfrun).");
    dtf::add_cluster_flags(flags, j.cf_);
    flags.add("data", j.data_dir_, "directory holding the Fashion-MNIST IDX files")
        .add("epochs", j.epochs, "passes over each worker's shard of the training set")
        .add("batch", j.batch, "examples per local step")
        .add("seed", j.seed, "seed for initialisation and shuffling")
        .add("partitioner", j.partitioner_, "greedy, round_robin or fixed_size")
        .add("num_shards", j.num_shards_, "shards per variable for --partitioner fixed_size")
        .add("secret", j.secret_, "cluster secret (default: $DTF_CLUSTER_SECRET; empty: no authentication)")
        .add("timeout_ms", j.timeout_ms, "deadline of every request to a ps")
        .add("finish_timeout_s", j.finish_timeout_s_, "chief: how long to wait for the other workers to finish")
        .add("log_every", j.log_every, "iterations (local steps) between progress lines")
        .add("train_examples", j.train_examples_, "use only the first N training examples (0: all)")
        .add("blas_threads", j.blas_threads_, "BLAS threads per process")
        .add("target_accuracy", j.target_accuracy_, "chief: exit with status 1 if the final test accuracy is lower")
        .add("metrics_file", j.metrics_file_, "chief: write the final accuracy, loss, global_step and wall_s there (JSON)");
    add_flags(flags);
    if (!flags.parse(argc, argv)) return std::nullopt;
    j.resolve();
    return j;
  }

  bool is_ps() const { return cluster.self.job == "ps"; }
  bool is_chief() const { return cluster.is_chief(); }
  const std::string& me() const { return me_; }

  /// The ps role: serve until the chief's shutdown.
  int run_ps() {
    dtf::parameter_server ps(cluster.spec.address(cluster.self), dtf::ps_options{transport, ps_threads});
    std::printf("%s: serving %zu shards (%zu bytes) for %s\n", me_.c_str(), layout.shards_on(cluster.self.index).size(),
                layout.bytes_on(cluster.self.index), scheme_);
    std::fflush(stdout);
    ps.run();
    std::printf("%s: shut down by the chief at global step %lld; exiting\n", me_.c_str(),
                static_cast<long long>(ps.global_step()));
    return 0;
  }

  /// A connected client of every ps.
  std::unique_ptr<dtf::ps_client> connect() {
    std::vector<std::string> addresses;
    for (const auto& t : cluster.spec.tasks("ps")) addresses.push_back(cluster.spec.address(t));
    auto ps = std::make_unique<dtf::ps_client>(addresses, layout, transport);
    ps->connect();
    return ps;
  }

  /// This worker's shard of the training set (shuffled, normalised, batched, repeated
  /// `epochs` times; -1 repeats forever).
  dtf::data::dataset train_shard(int repeat) const {
    return train_all_.shard(trainers, trainer).shuffle(seed + trainer).normalize().batch(std::size_t(batch))
        .repeat(repeat).prefetch(2);
  }
  /// Batches in one epoch of the given worker's shard.
  std::size_t shard_batches(std::size_t worker) const {
    return train_all_.shard(trainers, worker).batch(std::size_t(batch)).batches_per_epoch();
  }

  /// Test loss and accuracy of the centre variable θ̃.
  dtf::nn::evaluation evaluate_centre(dtf::ps_client& ps) {
    ps.pull(centre_host_);
    centre_.copy_from_host<float>(centre_host_);
    return dtf::nn::evaluate(net, centre_.span<float>(), test_);
  }

  void log_epoch(dtf::ps_client& ps, std::size_t epoch) {
    const auto e = evaluate_centre(ps);
    std::printf("%s: epoch %zu  centre test_loss %.4f  test_accuracy %.4f\n", me_.c_str(), epoch, e.loss, e.accuracy);
    std::fflush(stdout);
  }

  /// Ends a worker's part: reports done; the chief then waits for every worker, evaluates,
  /// prints the RESULT line (with `extra` appended) and shuts the parameter servers down.
  int finish(dtf::ps_client& ps, const std::string& extra) {
    ps.mark_done();
    if (!is_chief()) return 0;
    if (wait_for_workers && ps.wait_workers_done(trainers, std::chrono::seconds(finish_timeout_s_)) < trainers)
      throw dtf::error(dtf::errc::timeout,
                       "workers did not finish within " + std::to_string(finish_timeout_s_) + " s");
    const auto e = evaluate_centre(ps);
    const double wall = std::chrono::duration<double>(clock::now() - started_).count();
    const std::int64_t global_step = ps.global_step();
    std::printf("%s: final test accuracy %.4f  test_loss %.4f  global_step %lld  wall %.1fs\n", me_.c_str(), e.accuracy,
                e.loss, static_cast<long long>(global_step), wall);
    std::printf("RESULT scheme=%s workers=%zu accuracy=%.4f wall_s=%.1f %s\n", scheme_, trainers, e.accuracy, wall,
                extra.c_str());
    std::fflush(stdout);
    ps.shutdown();
    if (!metrics_file_.empty()) dtf::detail::write_metrics_file(metrics_file_, e.accuracy, e.loss, global_step, wall, trainers);
    if (e.accuracy < target_accuracy_) {
      std::fprintf(stderr, "%s: test accuracy %.4f is below the target %.4f\n", me_.c_str(), e.accuracy,
                   double(target_accuracy_));
      return 1;
    }
    return 0;
  }

  dtf::cluster cluster;
  dtf::transport_options transport;
  dtf::nn::sequential net = make_mlp();
  dtf::placement layout;
  std::size_t trainers = 1, trainer = 0;  // training tasks (chief + workers) and this one's index
  int epochs, batch, log_every = 200, timeout_ms = 60000;
  /// The chief's finish() waits for every worker's mark_done (false after a stop request:
  /// the job ends now, and tasks still training lose their parameter servers).
  bool wait_for_workers = true;
  std::uint64_t seed = 42;
  int ps_threads = 1;  ///< I/O threads of this task when it is a ps (run_ps)

 private:
  job(const char* scheme, job_defaults d) : epochs(d.epochs), batch(d.batch), scheme_(scheme) {}

  void resolve() {
    dtf::set_cpu_threads({.device = 1, .blas = blas_threads_});
    if (secret_.empty())
      if (const char* s = std::getenv("DTF_CLUSTER_SECRET")) secret_ = s;
    cluster = dtf::resolve_cluster(cf_);
    me_ = cluster.self.str();
    transport.cluster_id = cluster.id();
    transport.identity = me_;
    transport.secret = secret_;
    transport.timeout_ms = std::uint32_t(timeout_ms);
    layout = dtf::named_partitioner{partitioner_, std::size_t(num_shards_)}.place(net.variables(), cluster.num_ps());
    if (is_ps()) return;
    if (cluster.self.job != "worker" && cluster.self.job != "chief")
      throw dtf::error(dtf::errc::invalid_config,
                       std::string(scheme_) + " runs as ps, worker or chief, not " + cluster.self.job);
    const bool has_chief_job = cluster.spec.num_tasks("chief") > 0;
    trainers = cluster.num_workers() + (has_chief_job ? 1 : 0);
    trainer = cluster.self.job == "chief" ? 0 : cluster.self.index + (has_chief_job ? 1 : 0);
    train_all_ = dtf::data::load_fashion_mnist(dtf::data::split::train, data_dir_);
    if (train_examples_ > 0) train_all_ = train_all_.take(std::size_t(train_examples_));
    test_ = dtf::data::load_fashion_mnist(dtf::data::split::test, data_dir_).normalize().batch(1000);
    centre_.resize({net.num_parameters()});
    centre_host_.resize(net.num_parameters());
  }

  const char* scheme_;
  clock::time_point started_ = clock::now();
  dtf::cluster_flags cf_;
  std::string data_dir_ = dtf::data::fashion_mnist_default_dir, partitioner_ = "greedy", secret_, me_;
  std::string metrics_file_;
  int blas_threads_ = 1, train_examples_ = 0, finish_timeout_s_ = 1800, num_shards_ = 2;
  float target_accuracy_ = 0.0f;
  dtf::data::dataset train_all_{xt::xtensor<float, 2>::from_shape({0, 1}), xt::xtensor<std::int32_t, 1>::from_shape({0}),
                                0.0f, 1.0f};
  dtf::data::dataset test_ = train_all_;
  dtf::tensor centre_;
  std::vector<float> centre_host_;
};

}  // namespace examples
