// dtf/train_flags.hpp — the standard command-line flags of a training program, for programs
// that want them (dtf::train itself takes plain options and reads no flags).
//
//   dtf::train_flags tf;                                   // defaults: train_options' own
//   dtf::flag_parser flags("Trains my model.");
//   tf.add_to(flags);                                      // cluster, checkpoints, summaries, ...
//   if (!flags.parse(argc, argv)) return 0;                // --help
//   const dtf::cluster cluster = tf.resolve_cluster();
//   auto r = dtf::train(cluster, net, data, strategy, tf.options(cluster, "my_scheme"), tf.partitioner());
//   // a strategy's rule with --weight_decay: tf.rule("adamw", lr) (dtf::optim::make_rule's names)
//
// Flags (the set: ps = parameter-server strategies, collective = no ps):
//   cluster        --job_name --task_index --ps_hosts --worker_hosts --chief_host --num_ps
//                  --base_port --rendezvous (dtf/cluster.hpp; also TF_CONFIG, Slurm, MPI)
//   every set      --epochs --batch --seed --secret_file --tls --timeout_ms --log_every --blas_threads
//                  --gpu --share_gpus (CUDA builds: dtf/device/select.hpp)
//                  --model_dir --save_checkpoints_steps --save_checkpoints_secs --keep_checkpoints
//                  --last_step --num_steps --summary_every --nan_policy fail|stop
//                  --metrics_file --target_accuracy
//                  --clip_norm (train_options::clip_norm) --weight_decay (the rule of rule())
//   ps             --partitioner greedy|round_robin|fixed_size --num_shards --finish_timeout_s
//                  --max_recoveries --ps_threads --position_every --slow_worker --slow_ms
//   collective     --segment_kib --backward_passes_per_step --cuda_graph (--nocuda_graph: off)
// Errors: a value out of range is dtf::error(errc::invalid_config) naming the flag.
#pragma once

#include <dtf/cluster.hpp>
#include <dtf/device/select.hpp>
#include <dtf/error.hpp>
#include <dtf/flags.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/runtime.hpp>
#include <dtf/train.hpp>
#include <dtf/transport/credentials.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dtf {

/// A partitioner chosen at run time by name: "greedy" (greedy_load_balancing), "round_robin"
/// or "fixed_size" (num_shards shards per variable). Models dtf::partitioner.
struct named_partitioner {
  /// "greedy", "round_robin" or "fixed_size".
  std::string name = "greedy";
  /// Shards per variable for "fixed_size".
  std::size_t num_shards = 2;
  /// dtf::partitioner: the placement of `vars` on `num_ps` ps tasks. Errors: errc::invalid_config
  /// for an unknown name.
  placement place(const std::vector<variable_spec>& vars, std::size_t num_ps) const {
    if (name == "greedy") return partitioners::greedy_load_balancing{}.place(vars, num_ps);
    if (name == "round_robin") return partitioners::round_robin{}.place(vars, num_ps);
    if (name == "fixed_size") return partitioners::fixed_size{num_shards}.place(vars, num_ps);
    throw error(errc::invalid_config,
                "--partitioner: unknown '" + name + "' (expected greedy, round_robin or fixed_size)");
  }
};
static_assert(partitioner<named_partitioner>);

/// Which flags a program offers.
enum class train_flag_set {
  ps,          ///< parameter-server strategies
  collective,  ///< collective strategies (no ps; runs alone without a cluster)
};

/// The standard command-line flags of a training program (cluster, checkpoints, summaries,
/// strategy knobs, ...): add_to() registers them on a flag_parser, options() turns them into
/// train_options.
struct train_flags {
  /// The cluster flags (dtf::cluster_flags).
  cluster_flags cluster;
  train_options train;  ///< the defaults the flags show; options() fills the rest
  /// --nan_policy: "fail" or "stop".
  std::string nan_policy = "fail";
  /// --partitioner: greedy, round_robin or fixed_size.
  std::string partitioner_name = "greedy";
  /// --num_shards: shards per variable for --partitioner fixed_size.
  int num_shards = 2;
  int blas_threads = 1;    ///< --blas_threads (0: the BLAS library's default)
  int device_threads = 1;  ///< OpenMP threads of Thrust's device system on CPU builds (no flag of its own)
  /// --gpu, --share_gpus (CUDA builds): this process's GPU (-1: from the launcher's local rank),
  /// and whether more local processes than GPUs may share them (dtf/device/select.hpp).
  device::selection_options gpu;
  /// The GPU resolve_cluster() chose for this training task (CUDA builds; none on CPU builds
  /// and for a ps).
  mutable std::optional<device::selection> gpu_selected;
  /// --slow_worker, --slow_ms (synchronous strategies): the index of a worker to slow down (-1:
  /// none) and the milliseconds added to each of its gradients.
  ///@{
  int slow_worker = -1, slow_ms = 0;
  ///@}
  /// --secret_file: a file holding the master secret (dtf::read_secret_file). A secret is never a
  /// flag's value: command lines are readable by every local user.
  std::string secret_file;
  /// Credentials taken from the environment (credentials_from_environment()).
  struct environment_credentials {
    std::string secret /**< DTF_CLUSTER_SECRET */, task_key /**< DTF_TASK_KEY */, ring_key /**< DTF_RING_KEY */;
  };
  mutable std::optional<environment_credentials> taken_;  ///< what credentials_from_environment() took
  /// --segment_kib: the allreduce segment size in KiB.
  int segment_kib = 256;
  /// --weight_decay: the weight decay rule() gives the update rule (PyTorch's: the L2 penalty of
  /// sgd, momentum, adagrad and adam, AdamW's decoupled decay); empty: the rule's own (0; adamw
  /// 0.01). A string, so that "not given" differs from 0.
  std::string weight_decay;
  /// Which flags the program offers.
  train_flag_set set = train_flag_set::ps;

  /// Registers the flags of `s` on the parser, bound to this object's fields.
  void add_to(flag_parser& f, train_flag_set s = train_flag_set::ps) {
    set = s;
    if (s == train_flag_set::collective) cluster.num_ps = 0;  // every rank trains
    add_cluster_flags(f, cluster);
    f.add("epochs", train.epochs, "passes over each training task's shard of the training set")
        .add("batch", train.batch, "examples per local step")
        .add("seed", train.seed, "seed for initialisation and shuffling")
        .add("secret_file", secret_file,
             "file holding the cluster's master secret, mode 0600 and yours (default: $DTF_CLUSTER_SECRET, or "
             "$DTF_TASK_KEY from dtfrun; none: no authentication)")
        .add("tls", train.tls, "encrypt every connection between tasks with TLS 1.3 keyed by the credentials (default: $DTF_TLS=1)")
        .add("timeout_ms", train.timeout_ms,
             s == train_flag_set::ps ? "deadline of every request to a ps" : "longest wait without progress inside a collective")
        .add("log_every", train.log_every, "iterations (local steps) between progress lines")
        .add("blas_threads", blas_threads, "BLAS threads per process")
        .add("gpu", gpu.device, "CUDA builds: this process's GPU (-1: from the launcher's local rank)")
        .add("share_gpus", gpu.share,
             "CUDA builds: let more processes than GPUs on a host share them (or $DTF_SHARE_GPUS=1)")
        .add("model_dir", train.model_dir, "checkpoints and TensorBoard event files; resumes from its latest checkpoint")
        .add("save_checkpoints_steps", train.save_checkpoints_steps, "chief: checkpoint every N global steps (0: off)")
        .add("save_checkpoints_secs", train.save_checkpoints_secs, "chief: checkpoint every S seconds (0: off)")
        .add("keep_checkpoints", train.keep_checkpoints, "checkpoints to keep (0: all)")
        .add("last_step", train.last_step, "stop at this global step (0: the example's own end)")
        .add("num_steps", train.num_steps, "stop after this many more global steps (0: the example's own end)")
        .add("summary_every", train.summary_every, "chief: TensorBoard summaries every N global steps (0: none)")
        .add("nan_policy", nan_policy, "a NaN or infinite loss: fail (exit with an error) or stop (save, end cleanly)")
        .add("metrics_file", train.metrics_file, "chief: write the final accuracy, loss, global_step and wall_s there (JSON)")
        .add("target_accuracy", train.target_accuracy, "chief: exit with status 1 if the final test accuracy is lower")
        .add("clip_norm", train.clip_norm,
             "clip the gradient to this global norm, torch.nn.utils.clip_grad_norm_'s formula (0: off)")
        .add("weight_decay", weight_decay,
             "weight decay of the update rule: L2 penalty (sgd, momentum, adagrad, adam), decoupled (adamw); empty: "
             "the rule's own (0; adamw 0.01)");
    if (s == train_flag_set::ps) {
      f.add("partitioner", partitioner_name, "greedy, round_robin or fixed_size")
          .add("num_shards", num_shards, "shards per variable for --partitioner fixed_size")
          .add("finish_timeout_s", train.finish_timeout_s, "chief: how long to wait for the other workers to finish")
          .add("max_recoveries", train.max_recoveries,
               "recover from a lost parameter server up to N times (with dtfrun --max-restarts; 0: fail)")
          .add("ps_threads", train.ps_threads, "I/O threads of a ps")
          .add("position_every", train.position_every,
               "local steps between reports of this task's data position to ps 0, where a restarted task resumes (0: none)")
          .add("slow_worker", slow_worker, "synchronous strategies: index of a worker to slow down (-1: none)")
          .add("slow_ms", slow_ms, "extra milliseconds per gradient of the slowed worker");
    } else {
      f.add("segment_kib", segment_kib, "allreduce segment size in KiB")
          .add("backward_passes_per_step", train.backward_passes_per_step,
               "backward passes (micro-batches of --batch / N rows) accumulated per step, Horovod's name")
          .add("cuda_graph", train.cuda_graph,
               "CUDA builds, one rank or the NCCL backend: replay each batch size's step as a CUDA graph where it applies "
               "(--nocuda_graph: every step eager)");
    }
  }

  /// Sets the CPU threads (blas_threads, device_threads) and resolves the cluster (dtf/cluster.hpp). With the
  /// collective set and no cluster in the flags or the environment: this process alone. On CUDA
  /// builds a training task then takes its GPU (device::select_device with --gpu, --share_gpus)
  /// and says which; a malformed local-rank variable is an error on every build.
  dtf::cluster resolve_cluster() const {
    set_cpu_threads({.device = device_threads, .blas = blas_threads});
    dtf::cluster c = set == train_flag_set::collective && !describes_cluster() ? local_cluster()
                                                                               : dtf::resolve_cluster(cluster);
    // A training task takes its GPU before anything allocates device memory (a ps needs none).
    if (c.self.job != "ps") {
      gpu_selected = device::select_device(gpu);
      if (gpu_selected) {
        std::printf("%s: %s\n", c.self.str().c_str(), gpu_selected->reason.c_str());
        std::fflush(stdout);
      }
    }
    return c;
  }

  /// The train_options of these flags for scheme `name` on cluster `c`. Errors name the flag.
  train_options options(const dtf::cluster& c, std::string name) const {
    auto bad = [](const std::string& flag, const std::string& why) {
      throw error(errc::invalid_config, "--" + flag + ": " + why);
    };
    if (nan_policy != "fail" && nan_policy != "stop") bad("nan_policy", "'" + nan_policy + "' is neither fail nor stop");
    if (num_shards < 1) bad("num_shards", "must be positive");
    if (segment_kib < 1) bad("segment_kib", "must be positive");
    if (slow_ms < 0) bad("slow_ms", "must not be negative");
    if (train.last_step > 0 && train.num_steps > 0) bad("num_steps", "give --last_step or --num_steps, not both");
    if (!(train.clip_norm >= 0) || std::isinf(train.clip_norm)) bad("clip_norm", "must be 0 (off) or a positive number");
    if (train.backward_passes_per_step < 1) bad("backward_passes_per_step", "must be at least 1");
    weight_decay_value();  // checked here, whether or not the program calls rule()
    train_options o = train;
    o.name = std::move(name);
    o.nan_policy = nan_policy == "stop" ? hooks::nan_policy::stop : hooks::nan_policy::fail;
    o.segment_bytes = std::size_t(segment_kib) * 1024;
    const auto& env = credentials_from_environment();
    if (o.secret.empty()) o.secret = secret_file.empty() ? env.secret : read_secret_file(secret_file);
    if (o.task_key.empty()) o.task_key = env.task_key;
    if (o.ring_key.empty()) o.ring_key = env.ring_key;
    check_secret_length(o.secret, secret_file.empty() ? "$DTF_CLUSTER_SECRET" : "--secret_file " + secret_file);
    if (!o.tls)
      if (const char* t = std::getenv("DTF_TLS")) {
        const std::string v = t;
        if (v == "1" || v == "true") o.tls = true;
        else if (v != "" && v != "0" && v != "false") bad("tls", "$DTF_TLS is '" + v + "', expected 1, true, 0 or false");
      }
    if (slow_worker >= 0 && c.self.job != "ps" && trainer_index(c) == std::size_t(slow_worker))
      o.compute_delay = std::chrono::milliseconds(slow_ms);
    return o;
  }

  /// The credentials in this process's environment ($DTF_CLUSTER_SECRET, $DTF_TASK_KEY,
  /// $DTF_RING_KEY), read by this object's first options() and then removed from the
  /// environment, so that nothing this task starts inherits them. Not thread-safe (setenv's rule).
  const environment_credentials& credentials_from_environment() const {
    if (!taken_) {
      environment_credentials c;
      const auto take = [](const char* name, std::string& into) {
        if (const char* v = std::getenv(name)) into = v;
        ::unsetenv(name);
      };
      take("DTF_CLUSTER_SECRET", c.secret);
      take("DTF_TASK_KEY", c.task_key);
      take("DTF_RING_KEY", c.ring_key);
      taken_ = std::move(c);
    }
    return *taken_;
  }

  /// The update rule `name` (dtf::optim::make_rule: sgd, momentum, nesterov, adagrad, adam or
  /// adamw) at rate `lr`, with --weight_decay when given. Errors: errc::invalid_config naming
  /// --weight_decay for a value that is not a number, negative or not finite; make_rule's for
  /// an unknown name.
  optim::rule rule(std::string_view name, float lr) const {
    optim::rule r = optim::make_rule(name, lr);
    if (const auto wd = weight_decay_value()) std::visit([&](auto& alt) { alt.weight_decay = *wd; }, r);
    return r;
  }

  /// --weight_decay's value; none when it is empty. Errors: as rule().
  std::optional<float> weight_decay_value() const {
    if (weight_decay.empty()) return std::nullopt;
    float v = 0;
    const char* end = weight_decay.data() + weight_decay.size();
    const auto [ptr, ec] = std::from_chars(weight_decay.data(), end, v);
    if (ec != std::errc() || ptr != end)
      throw error(errc::invalid_config, "--weight_decay: cannot parse '" + weight_decay + "'");
    if (!(v >= 0) || std::isinf(v))
      throw error(errc::invalid_config, "--weight_decay: " + weight_decay + " (must be 0 or a positive number)");
    return v;
  }

  /// The partitioner --partitioner and --num_shards name.
  named_partitioner partitioner() const { return {partitioner_name, std::size_t(num_shards)}; }

 private:
  /// Whether the flags or the environment describe a cluster.
  bool describes_cluster() const {
    for (const char* v : {"TF_CONFIG", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
      if (const char* s = std::getenv(v); s && *s) return true;
    return !cluster.job_name.empty();
  }
};

}  // namespace dtf
