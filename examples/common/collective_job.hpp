// What the collective examples (ring_allreduce, mirrored) share: flags, the communicator (a
// cluster from flags, TF_CONFIG, mpirun or srun; this process alone without one), the data and
// its shards, the step loop in the standard session with the chief's evaluation after every
// epoch, and the end of the run (final evaluation, RESULT line, --metrics_file, target).
#pragma once

#include <dtf/cluster.hpp>
#include <dtf/collectives.hpp>
#include <dtf/dtf.hpp>

#include "hooks.hpp"
#include "metrics.hpp"
#include "mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace examples {

class collective_job {
 public:
  using clock = std::chrono::steady_clock;

  /// Parses the common flags (their help speaks of one `unit`'s batch: "worker" or
  /// "replica") and those `add_flags` registers, then connects the ranks. nullopt: --help.
  static std::optional<collective_job> setup(int argc, char** argv, const char* scheme, const char* description,
                                             const char* unit,
                                             const std::function<void(dtf::flag_parser&)>& add_flags) {
    std::optional<collective_job> j(collective_job{scheme});
    const std::string u(unit);
    dtf::flag_parser flags(description);
    dtf::add_cluster_flags(flags, j->cf_);
    j->hooks.add_to(flags, false, false);
    flags.add("data", j->data_dir_, "directory holding the Fashion-MNIST IDX files")
        .add("epochs", j->epochs, "passes over each " + u + "'s shard of the training set")
        .add("batch", j->batch, "examples per " + u + " and step")
        .add("optimizer", j->optimizer, "sgd, momentum, nesterov, adagrad or adam")
        .add("lr", j->lr, "base learning rate (for one " + u + "'s batch)")
        .add("linear_scaling", j->linear_scaling, "scale the rate by the " + u + "s in all; --nolinear_scaling: off")
        .add("warmup_steps", j->warmup_steps, "ramp from lr to the scaled rate over this many steps (with --linear_scaling)")
        .add("seed", j->seed, "seed for initialisation and shuffling")
        .add("secret", j->secret_, "cluster secret (default: $DTF_CLUSTER_SECRET; empty: no authentication)")
        .add("timeout_ms", j->timeout_ms, "longest wait without progress inside a collective")
        .add("segment_kib", j->segment_kib_, "allreduce segment size in KiB")
        .add("log_every", j->log_every, "steps between progress lines")
        .add("train_examples", j->train_examples_, "use only the first N training examples (0: all)")
        .add("blas_threads", j->blas_threads_, "BLAS threads per process")
        .add("metrics_file", j->metrics_file_, "chief: write the final metrics as JSON here")
        .add("target_accuracy", j->target_accuracy_, "chief: exit with status 1 if the final test accuracy is lower");
    add_flags(flags);
    if (!flags.parse(argc, argv)) return std::nullopt;
    j->connect();
    return j;
  }

  collective_job(collective_job&&) = default;

  std::size_t rank() const { return comm->rank(); }
  const std::string& me() const { return me_; }
  const std::string& source() const { return source_; }

  /// Every rank runs the same number of steps: `epochs` × the smallest of the `global`
  /// shards' batches per epoch.
  void set_shards(std::size_t global) {
    global_ = global;
    per_epoch_ = SIZE_MAX;
    for (std::size_t g = 0; g < global; ++g)
      per_epoch_ = std::min(per_epoch_, train_all_.shard(global, g).batch(std::size_t(batch)).batches_per_epoch());
    last_step = std::int64_t(epochs) * std::int64_t(per_epoch_);
  }
  /// Shard g of the `global` set by set_shards: shuffled, normalised, batched, repeated.
  dtf::data::dataset shard(std::size_t g) const {
    return train_all_.shard(global_, g).shuffle(seed + g).normalize().batch(std::size_t(batch)).repeat(-1).prefetch(2);
  }

  /// Trains until the session stops: step() runs one step through the session; the chief
  /// evaluates (evaluate()) after every epoch and at the end. Then the chief prints the
  /// final lines (RESULT with `result_extra` after the worker count) and writes
  /// --metrics_file. Returns the exit status (1: below --target_accuracy).
  template <class Session, class Strategy>
  int train(Session& session, Strategy& strategy, const std::function<void()>& step,
            const std::function<dtf::nn::evaluation()>& evaluate, const std::string& result_extra) {
    const auto t0 = clock::now();
    const std::int64_t first_step = strategy.global_step();
    dtf::nn::evaluation eval{};
    std::int64_t evaluated_at = -1;
    auto report = [&](const std::string& label) {
      eval = evaluate();
      evaluated_at = strategy.global_step();
      std::printf("%s: %s  test_loss %.4f  test_accuracy %.4f\n", me_.c_str(), label.c_str(), eval.loss,
                  eval.accuracy);
      std::fflush(stdout);
    };
    const auto per_epoch = std::int64_t(per_epoch_);
    while (!session->should_stop()) {
      step();
      const std::int64_t s = strategy.global_step();
      if (rank() == 0 && s % per_epoch == 0 && s != evaluated_at) report("epoch " + std::to_string(s / per_epoch));
    }
    session->close();
    const double train_s = std::chrono::duration<double>(clock::now() - t0).count();
    const std::int64_t final_step = strategy.global_step();
    const std::int64_t trained = std::max<std::int64_t>(1, final_step - first_step);
    comm->barrier();  // nobody leaves while another still needs its connections
    if (rank() != 0) return 0;
    // Stopped part-way through an epoch (--last_step, --num_steps, a signal): evaluate what was trained.
    if (evaluated_at != final_step) report("stopped at step " + std::to_string(final_step));
    const double wall = std::chrono::duration<double>(clock::now() - started_).count();
    std::printf("%s: final test accuracy %.4f  test_loss %.4f  global_step %lld  wall %.1fs\n", me_.c_str(),
                eval.accuracy, eval.loss, static_cast<long long>(final_step), wall);
    std::printf("RESULT scheme=%s workers=%zu %saccuracy=%.4f wall_s=%.1f step_ms=%.2f samples_per_s=%.0f\n", scheme_,
                comm->size(), result_extra.c_str(), eval.accuracy, wall, 1e3 * train_s / double(trained),
                double(trained) * double(batch) * double(global_) / train_s);
    std::fflush(stdout);
    if (!metrics_file_.empty())
      write_metrics_file(metrics_file_, eval.accuracy, eval.loss, final_step, wall, comm->size());
    if (eval.accuracy < target_accuracy_) {
      std::fprintf(stderr, "%s: test accuracy %.4f is below the target %.4f\n", me_.c_str(), eval.accuracy,
                   double(target_accuracy_));
      return 1;
    }
    return 0;
  }

  hook_flags hooks;
  std::optional<dtf::communicator> comm;
  dtf::data::dataset test = empty_dataset();
  std::string optimizer = "adam";
  int epochs = 5, batch = 64, log_every = 200, timeout_ms = 60000, warmup_steps = 100;
  bool linear_scaling = true;
  float lr = 1e-3f;
  std::uint64_t seed = 42;
  std::int64_t last_step = 0;

 private:
  explicit collective_job(const char* scheme) : scheme_(scheme) { cf_.num_ps = 0; }  // every rank trains

  static dtf::data::dataset empty_dataset() {
    return {xt::xtensor<float, 2>::from_shape({0, 1}), xt::xtensor<std::int32_t, 1>::from_shape({0}), 0.0f, 1.0f};
  }

  /// A cluster when the flags or the environment describe one; this process alone otherwise.
  bool has_cluster() const {
    for (const char* v : {"TF_CONFIG", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
      if (const char* s = std::getenv(v); s && *s) return true;
    return !cf_.job_name.empty();
  }

  void connect() {
    dtf::set_cpu_threads({.device = 1, .blas = blas_threads_});
    if (secret_.empty())
      if (const char* s = std::getenv("DTF_CLUSTER_SECRET")) secret_ = s;
    dtf::collective_options options;
    options.secret = secret_;
    options.timeout_ms = std::uint32_t(timeout_ms);
    options.segment_bytes = std::size_t(segment_kib_) * 1024;
    if (has_cluster()) {
      dtf::cluster cluster = dtf::resolve_cluster(cf_);
      options.cluster_id = cluster.id();
      me_ = cluster.self.str();
      source_ = cluster.source;
      comm.emplace(dtf::make_communicator(cluster, options));
    } else {
      comm.emplace(dtf::communicator::single(options));
    }
    train_all_ = dtf::data::load_fashion_mnist(dtf::data::split::train, data_dir_);
    if (train_examples_ > 0) train_all_ = train_all_.take(std::size_t(train_examples_));
    test = dtf::data::load_fashion_mnist(dtf::data::split::test, data_dir_).normalize().batch(1000);
  }

  const char* scheme_;
  clock::time_point started_ = clock::now();
  dtf::cluster_flags cf_;
  std::string data_dir_ = dtf::data::fashion_mnist_default_dir, secret_, metrics_file_, me_ = "local",
              source_ = "none";
  int segment_kib_ = 256, train_examples_ = 0, blas_threads_ = 1;
  float target_accuracy_ = 0.0f;
  dtf::data::dataset train_all_ = empty_dataset();
  std::size_t global_ = 1, per_epoch_ = 1;
};

}  // namespace examples
