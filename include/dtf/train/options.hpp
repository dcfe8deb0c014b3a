// dtf/train/options.hpp — what dtf::train takes and returns (dtf/train.hpp), and the cluster
// arithmetic of its roles (training tasks, this task's index among them).
#pragma once

#include <dtf/cluster.hpp>
#include <dtf/config.hpp>
#include <dtf/concepts.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/error.hpp>
#include <dtf/hooks/nan_tensor.hpp>
#include <dtf/nn/evaluate.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/strategies/async.hpp>
#include <dtf/strategies/sync.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

namespace dtf {

/// What dtf::train does besides the strategy's steps. Units in the names; 0 turns a cadence off.
struct train_options {
  std::string name = "dtf";  ///< the scheme in RESULT lines and messages
  int epochs = 5;            ///< passes over each training task's shard (the job's end unless a step limit is set)
  std::int64_t last_step = 0;  ///< stop at this global step (0: after `epochs`)
  std::int64_t num_steps = 0;  ///< stop after this many more global steps (0: after `epochs`)
  std::size_t batch = 64;      ///< examples per local step (per replica for mirrored)
  std::uint64_t seed = 42;     ///< initialisation; shard k shuffles with seed + k
  std::string model_dir;       ///< checkpoints and event files; resumes from its latest checkpoint (empty: neither)
  std::int64_t save_checkpoints_steps = 0;  ///< chief: a checkpoint every N global steps
  double save_checkpoints_secs = 600;       ///< chief: a checkpoint every S seconds
  int keep_checkpoints = 5;                 ///< max_to_keep (0: all)
  int summary_every = 100;                  ///< chief: summaries every N global steps (0: none)
  /// What a NaN or infinite loss does: fail, or stop cleanly.
  hooks::nan_policy nan_policy = hooks::nan_policy::fail;
  int max_recoveries = 0;   ///< ps strategies and hybrid: carry on after a lost ps up to N times (0: fail)
  int log_every = 200;      ///< local steps between progress lines
  /// ps strategies: local steps between reports of this task's data position to ps 0 (saved
  /// with every checkpoint), where a restarted task resumes its shard (0: no reports; a
  /// restarted task then starts its shard over). See dtf/ps/positions.hpp.
  int position_every = 1;
  /// Credentials (docs/design/identity.md; train_flags reads $DTF_CLUSTER_SECRET, $DTF_TASK_KEY,
  /// $DTF_RING_KEY and --secret_file). `secret`: the master secret (a ps needs it; a worker or
  /// chief that holds it can present any identity). `task_key`: this task's own key, the only
  /// identity it can present to a ps. `ring_key`: the collective ranks' shared key (derived from
  /// `secret` when empty). All empty: no authentication.
  std::string secret;
  std::string task_key;  ///< this task's own key K(identity) (see `secret`)
  std::string ring_key;  ///< the collective ranks' shared key R (see `secret`)
  /// Every connection between tasks inside TLS 1.3 keyed by the secret (dtf/transport/tls.hpp;
  /// train_flags: --tls or DTF_TLS=1): the ps transport of ps strategies, the ring sockets
  /// (collective_options::tls) of collective ones. Needs a secret.
  bool tls = false;
  std::uint32_t timeout_ms = 60000;  ///< a ps request's deadline; a collective's longest wait without progress
  int finish_timeout_s = 1800;       ///< chief: how long to wait for the other workers to finish
  int ps_threads = 1;                ///< I/O threads of a ps task
  std::size_t segment_bytes = 256 * 1024;  ///< collective: allreduce segment size
  /// Collective strategies that take device batches (ring_allreduce; one replica per process):
  /// upload each rank's shard to the device once and gather every batch there
  /// (data::device_shard) instead of building it on the host and copying it each step. The same
  /// batches bit for bit, so results, positions and resumption are unchanged. On by default on
  /// CUDA builds; off on CPU builds, where both paths read host memory and the host streams
  /// build their batches on a background thread.
  bool device_data = DTF_CUDA;
  /// Collective strategies whose engine and model can leave the step's loss on the device
  /// (ring_allreduce with a dtf::defers_loss model such as nn::sequential): read the losses
  /// through a ring at the hooks' cadence instead of once per step (dtf/train/loss_reads.hpp).
  /// Off: the step returns its loss to the host, as before. The parameters are the same.
  bool loss_ring = true;
  /// The step as CUDA graphs (docs/design/gpu-execution.md, section 7) where it applies:
  /// ring_allreduce on one rank (a single-process run or a ring of one) or on several with the
  /// NCCL backend (its allreduces captured too), device_data, loss_ring with a model that defers
  /// its loss and can be captured (nn::sequential with labels checked at upload),
  /// backward_passes_per_step 1. Each batch size's second step is captured, later ones replay it;
  /// on one rank the parameters are the eager step's bit for bit. Elsewhere (and off) the step is
  /// eager. CPU builds run the CPU twin: the same steps, eagerly.
  bool cuda_graph = true;
  /// Test loss and accuracy of parameters (device memory, the model's layout); called by the
  /// chief after each of its epochs and at the end. Empty: no evaluation (RESULT has no accuracy).
  std::function<nn::evaluation(std::span<const float> params)> evaluate;
  /// The same for an embedding model (dtf/embedding_model.hpp): dense parameters and a reader
  /// of the tables' rows on the ps (e.g. dtf::evaluate_on(net, test) of an embedding classifier).
  std::function<nn::evaluation(std::span<const float> params, const row_reader& rows)> evaluate_rows;
  /// Embedding models: the rule the ps applies to the tables' row gradients (none: the
  /// strategy's ps rule).
  std::optional<optim::rule> embedding_rule;
  /// The learning rate at a global step in an epoch, reported as "learning_rate" (empty: none;
  /// collective strategies report their own).
  std::function<double(std::int64_t global_step, std::size_t epoch)> learning_rate;
  /// Clip each step's gradient to this global L2 norm, as torch.nn.utils.clip_grad_norm_ (0:
  /// off; dtf/optim/clip.hpp). Collective strategies: the averaged gradient after the reduce,
  /// which every rank clips alike so the replicas stay equal (it sets the strategy's
  /// config.clip_norm). Parameter-server strategies: each worker's own gradient of each batch,
  /// before the strategy uses or pushes it, as TensorFlow's parameter-server training clips on
  /// the workers: not the aggregate the ps applies. Dense models only.
  float clip_norm = 0;
  /// Collective strategies: backward passes per step (Horovod's backward_passes_per_step): each
  /// replica's batch runs as this many micro-batches whose gradients are accumulated before the
  /// step's one reduce (dtf/strategies/micro_batches.hpp; it sets the strategy's
  /// config.backward_passes_per_step). 1: one pass.
  int backward_passes_per_step = 1;
  /// Synchronous strategies: this task's gradients take this much longer (a straggler, for benchmarks).
  std::chrono::milliseconds compute_delay{0};
  std::string metrics_file;   ///< chief: the final figures as JSON, written atomically (empty: none)
  double target_accuracy = 0;  ///< chief: exit code 1 when the final accuracy is lower
  std::string result_extra;    ///< extra key=value tokens for the RESULT line
};

/// What a task's train() returns.
struct train_result {
  int exit_code = 0;             ///< 0, or 1 below target_accuracy; a ps task: 0 after the chief's shutdown
  std::int64_t global_step = 0;  ///< the last global step this task saw
  double loss = 0;               ///< this task's last training loss
  std::optional<nn::evaluation> evaluation;  ///< chief: the final test metrics (with options.evaluate)
  double wall_s = 0;             ///< from train()'s start to its end
  strategies::staleness_stats staleness;  ///< asynchronous: this worker's pushes
  strategies::drop_stats drops;           ///< synchronous: this worker's contributions and dropped ones
  /// Whether SIGTERM or SIGINT ended the training.
  bool stopped_by_signal = false;
  int recoveries = 0;            ///< lost-ps recoveries this task went through
};

/// A cluster of this process alone (collective strategies: one rank; no ps).
inline cluster local_cluster() {
  cluster c;
  c.self = {"worker", 0};
  c.source = "local";
  return c;
}

/// The training tasks of a cluster (chief and workers) and this task's index among them
/// (the chief is 0).
///@{
inline std::size_t num_trainers(const cluster& c) {
  return c.num_workers() + (c.spec.num_tasks("chief") > 0 ? 1 : 0);
}
inline std::size_t trainer_index(const cluster& c) {
  const bool has_chief_job = c.spec.num_tasks("chief") > 0;
  return c.self.job == "chief" ? 0 : c.self.index + (has_chief_job ? 1 : 0);
}
///@}

/// An evaluation callback for options.evaluate: nn::evaluate of `m` over `test` (the model's own
/// loss where it has one: dtf::evaluates_loss).
template <model M>
  requires classifier<M> || evaluates_loss<M>
std::function<nn::evaluation(std::span<const float>)> evaluate_on(M& m, data::dataset test) {
  return [&m, test = std::move(test)](std::span<const float> p) { return nn::evaluate(m, p, test); };
}
/// The same for an embedding classifier, for options.evaluate_rows.
template <embedding_classifier M>
std::function<nn::evaluation(std::span<const float>, const row_reader&)> evaluate_on(M& m, data::dataset test) {
  return [&m, test = std::move(test)](std::span<const float> p, const row_reader& rows) {
    return nn::evaluate(m, p, rows, test);
  };
}
namespace detail {

using train_clock = std::chrono::steady_clock;

inline void validate(const train_options& o) {
  auto bad = [](const std::string& what, const std::string& why) {
    throw error(errc::invalid_config, "train: " + what + ": " + why);
  };
  if (o.epochs < 0) bad("epochs", "must not be negative");
  if (o.batch == 0) bad("batch", "must be positive");
  if (o.last_step < 0) bad("last_step", "must not be negative");
  if (o.num_steps < 0) bad("num_steps", "must not be negative");
  if (o.last_step > 0 && o.num_steps > 0) bad("num_steps", "give last_step or num_steps, not both");
  if (o.save_checkpoints_steps < 0) bad("save_checkpoints_steps", "must not be negative");
  if (o.save_checkpoints_secs < 0) bad("save_checkpoints_secs", "must not be negative");
  if (o.keep_checkpoints < 0) bad("keep_checkpoints", "must not be negative");
  if (o.summary_every < 0) bad("summary_every", "must not be negative");
  if (o.max_recoveries < 0) bad("max_recoveries", "must not be negative");
  if (o.log_every < 0) bad("log_every", "must not be negative");
  if (o.position_every < 0) bad("position_every", "must not be negative");
  if (!(o.clip_norm >= 0)) bad("clip_norm", "must be 0 (off) or positive");
  if (o.backward_passes_per_step < 1) bad("backward_passes_per_step", "must be at least 1");
}

/// A collective strategy with options.clip_norm and backward_passes_per_step set in its config
/// (the options win when set; a config that sets another value is errc::invalid_config, as is a
/// strategy without these knobs when the options set them).
template <class S>
S with_loop_options(S s, const train_options& o) {
  if constexpr (requires { s.config.clip_norm; s.config.backward_passes_per_step; }) {
    if (o.clip_norm != 0) {
      if (s.config.clip_norm != 0 && s.config.clip_norm != o.clip_norm)
        throw error(errc::invalid_config, "train: clip_norm " + std::to_string(o.clip_norm) +
                                              " in the options and " + std::to_string(s.config.clip_norm) +
                                              " in the strategy's config (give one)");
      s.config.clip_norm = o.clip_norm;
    }
    if (o.backward_passes_per_step != 1) {
      if (s.config.backward_passes_per_step != 1 && s.config.backward_passes_per_step != o.backward_passes_per_step)
        throw error(errc::invalid_config, "train: backward_passes_per_step " + std::to_string(o.backward_passes_per_step) +
                                              " in the options and " + std::to_string(s.config.backward_passes_per_step) +
                                              " in the strategy's config (give one)");
      s.config.backward_passes_per_step = o.backward_passes_per_step;
    }
  } else {
    if (o.clip_norm != 0 || o.backward_passes_per_step != 1)
      throw error(errc::invalid_config, "train: clip_norm and backward_passes_per_step need a strategy whose config "
                                        "has them (ring_allreduce, mirrored)");
  }
  return s;
}
}  // namespace detail

}  // namespace dtf
