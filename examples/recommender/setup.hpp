// recommender/setup.hpp — the example's flags, its logs (Criteo TSV or synthetic, split into
// training and held-out examples) and its choice of strategy, so that main.cpp reads as the
// program: cluster, data, model, strategy, train.
#pragma once

#include <dtf/data/criteo.hpp>
#include <dtf/data/criteo_synthetic.hpp>
#include <dtf/dtf.hpp>
#include <dtf/metrics/binary_eval.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/hogwild.hpp>
#include <dtf/strategies/sync.hpp>

#include "model.hpp"

#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace examples::recommender {

// "64,32" -> {64, 32}; "" -> no hidden layer.
inline std::vector<std::size_t> parse_widths(const std::string& s) {
  std::vector<std::size_t> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ','))
    try {
      std::size_t used = 0;
      const unsigned long v = std::stoul(part, &used);
      if (used != part.size() || v == 0) throw std::invalid_argument(part);
      out.push_back(v);
    } catch (const std::logic_error&) {
      throw dtf::error(dtf::errc::invalid_config, "--hidden: '" + s + "' is not a list of positive widths (e.g. 64,32)");
    }
  return out;
}

/// The example's own flags (dtf::train_flags adds the cluster's and training's).
struct recommender_flags {
  std::string data_path, save_synthetic, strategy = "sync_sgd", hidden = "64,32", lr_decay = "constant";
  // The defaults (with main.cpp's 5 epochs) train to within 0.002 of the planted AUC under 2 ps
  // and 4 workers (hybrid) in about a minute here; Adagrad 0.3 on the rows stopped 0.0022 to
  // 0.0029 short (docs/benchmarks/recommender.md, "Closing the gap").
  std::size_t synthetic = 1000000, vocabulary = 10, max_examples = 0, sync_replicas = 0;
  std::uint64_t data_seed = 1;
  double test_fraction = 0.1, target_auc = 0;
  bool skip_malformed = false;
  dlrm_config model;
  float lr = 0.1f, embedding_lr = 0.1f, lr_floor = 0.0f;

  void add_to(dtf::flag_parser& flags) {
    flags.add("data", data_path, "Criteo TSV logs, plain or gzip (empty: --synthetic logs)")
        .add("max_examples", max_examples, "--data: read at most this many examples (0: all)")
        .add("skip_malformed", skip_malformed, "--data: skip and count malformed lines instead of failing")
        .add("synthetic", synthetic, "without --data: examples of synthetic logs with a planted model")
        .add("vocabulary", vocabulary, "synthetic logs: distinct values per categorical column")
        .add("data_seed", data_seed, "synthetic logs: their seed")
        .add("save_synthetic", save_synthetic,
             "write the --synthetic logs to this Criteo TSV file (gzip when it ends in .gz) and exit")
        .add("test_fraction", test_fraction, "the last fraction of the examples, held out for AUC and log loss")
        // hybrid: the table on the ps, the dense MLP by ring-allreduce among the workers
        // (docs/design/hybrid.md); the others send the dense gradients through the ps too.
        // benchmarks/recommender.sh reads the names from this flag's help.
        .add("strategy", strategy,
             "hybrid (rows applied as pushed), hybrid_sync (rows averaged per step), sync_sgd, hogwild or downpour")
        .add("sync_replicas", sync_replicas, "sync_sgd: contributions averaged per step (0: every worker)")
        .add("lr", lr, "SGD step size of the dense MLP")
        // On the default logs cosine decay changed the held-out AUC by less than the runs' spread;
        // the rows' Adagrad rate was what mattered (docs/benchmarks/recommender.md).
        .add("lr_decay", lr_decay,
             "hybrid strategies: the dense step size over the run, constant or cosine (from --lr to --lr_floor "
             "times it at the last step)")
        .add("lr_floor", lr_floor, "--lr_decay cosine: the last step's rate as a fraction of --lr")
        .add("embedding_lr", embedding_lr, "Adagrad step size of the embedding rows on the ps")
        .add("dim", model.dim, "floats per embedding (a row holds one more: the id's own weight)")
        .add("init_scale", model.init_scale, "rows start uniform in [-init_scale, init_scale]")
        .add("hidden", hidden, "widths of the MLP's hidden layers, comma-separated")
        .add("max_rows", model.max_rows, "rows the hashed table holds at most, over all ps")
        .add("evict_after", model.evict_after, "evict rows unseen for this many shard updates (0: never)")
        .add("target_auc", target_auc, "chief: exit with status 1 if the held-out AUC is lower");
  }

  /// Checks the flags and completes the model's configuration.
  void check() {
    if (strategy != "hybrid" && strategy != "hybrid_sync" && strategy != "sync_sgd" && strategy != "hogwild" &&
        strategy != "downpour")
      throw dtf::error(dtf::errc::invalid_config, "--strategy: unknown '" + strategy +
                                                      "' (expected hybrid, hybrid_sync, sync_sgd, hogwild or downpour)");
    if (!(test_fraction > 0 && test_fraction < 1))
      throw dtf::error(dtf::errc::invalid_config, "--test_fraction: must be in (0, 1)");
    if (lr_decay != "constant" && lr_decay != "cosine")
      throw dtf::error(dtf::errc::invalid_config, "--lr_decay: unknown '" + lr_decay + "' (expected constant or cosine)");
    if (lr_decay == "cosine" && strategy != "hybrid" && strategy != "hybrid_sync")
      throw dtf::error(dtf::errc::invalid_config,
                       "--lr_decay cosine: only the hybrid strategies take a schedule here, not --strategy " + strategy);
    if (!(lr_floor >= 0 && lr_floor <= 1))
      throw dtf::error(dtf::errc::invalid_config, "--lr_floor: must be in [0, 1]");
    model.hidden = parse_widths(hidden);
  }

  dtf::data::criteo_synthetic synthetic_logs() const {
    return dtf::data::synthetic_criteo({.examples = synthetic, .seed = data_seed, .vocabulary = vocabulary});
  }
};

/// The logs a task trains and evaluates on; on synthetic logs the planted model's held-out AUC
/// and log loss (its true click probabilities: the best any model of those logs reaches).
struct logs {
  dtf::data::dataset train, test;
  double best_auc = 0, best_log_loss = 0;
};

/// A ps trains nothing and reads no logs (a one-example placeholder); a worker reads --data or
/// generates --synthetic logs and holds out their last --test_fraction.
inline logs load_logs(const recommender_flags& f, const dtf::cluster& cluster) {
  dtf::data::criteo_columns cols;
  std::optional<dtf::data::criteo_synthetic> planted;
  if (cluster.self.job == "ps") {
    cols.labels.assign(1, 0.0f);
    cols.dense.assign(criteo_dense_columns, 0.0f);
    cols.ids.assign(criteo_categorical_columns, 0);
    return {.train = to_dataset(cols, 0, 1), .test = to_dataset(cols, 0, 1)};
  }
  if (!f.data_path.empty()) {
    cols = dtf::data::read_criteo(f.data_path, {.skip_malformed = f.skip_malformed, .max_examples = f.max_examples});
    if (cols.skipped)
      std::printf("%s: skipped %zu malformed lines (the first: %s)\n", cluster.self.str().c_str(), cols.skipped,
                  cols.first_skipped.c_str());
  } else {
    planted = f.synthetic_logs();
    cols = planted->columns();
  }
  const std::size_t n = cols.size();
  const std::size_t split = n - std::size_t(double(n) * f.test_fraction);
  if (split == 0 || split == n)
    throw dtf::error(dtf::errc::invalid_config, std::to_string(n) + " examples leave no training or no test set");
  logs out{.train = to_dataset(cols, 0, split), .test = to_dataset(cols, split, n)};
  if (planted) {
    const std::span<const float> p(planted->click_probability), y(planted->labels);
    out.best_auc = dtf::metrics::auc(p.subspan(split), y.subspan(split));
    out.best_log_loss = dtf::metrics::log_loss(p.subspan(split), y.subspan(split));
  }
  return out;
}

/// The chief's summary of the held-out figures (beside the planted model's); status 1 when the
/// AUC is below --target_auc, else the job's.
inline int report(const recommender_flags& f, const logs& data, const dtf::metrics::binary_metrics& held_out,
                  const dtf::train_result& r) {
  if (!r.evaluation || held_out.examples == 0) return r.exit_code;
  std::printf("recommender: held-out AUC %.4f, log loss %.4f over %llu examples", held_out.auc, held_out.log_loss,
              static_cast<unsigned long long>(held_out.examples));
  if (data.best_auc > 0) std::printf(" (the planted model's: AUC %.4f, log loss %.4f)", data.best_auc, data.best_log_loss);
  std::printf("\n");
  std::fflush(stdout);
  if (f.target_auc > 0 && !(held_out.auc >= f.target_auc)) {
    std::fprintf(stderr, "recommender: held-out AUC %.4f is below the target %.4f\n", held_out.auc, f.target_auc);
    return 1;
  }
  return r.exit_code;
}

/// --save_synthetic: writes the --synthetic logs for another program (benchmarks/recommender.sh's
/// TensorFlow peer) and returns true; else false.
inline bool save_synthetic(const recommender_flags& f) {
  if (f.save_synthetic.empty()) return false;
  f.synthetic_logs().write(f.save_synthetic, f.save_synthetic.ends_with(".gz"));
  std::printf("recommender: wrote %zu synthetic lines to %s\n", f.synthetic, f.save_synthetic.c_str());
  return true;
}

/// A worker's options for the held-out set: its AUC and log loss after each evaluation (into
/// the returned sink, for report()), and on synthetic logs the planted model's on the RESULT line.
template <class Net>
std::shared_ptr<dtf::metrics::binary_metrics> evaluate_held_out(const dtf::cluster& cluster, Net& net, const logs& data,
                                                                dtf::train_options& options) {
  auto held_out = std::make_shared<dtf::metrics::binary_metrics>();
  if (cluster.self.job == "ps") return held_out;
  options.evaluate_rows = dtf::metrics::binary_evaluate_on(net, data.test.batch(4096), held_out);
  char planted[96];  // on the RESULT line as report() prints them
  std::snprintf(planted, sizeof planted, "best_auc=%.4f best_log_loss=%.4f", data.best_auc, data.best_log_loss);
  if (data.best_auc > 0) options.result_extra = planted;
  return held_out;
}

/// Runs train(strategy) with the strategy --strategy names; `steps` is the run's steps per
/// worker (the span of --lr_decay).
template <class Train>
dtf::train_result train_with(const recommender_flags& f, const dtf::cluster& cluster, std::int64_t steps,
                             Train&& train) {
  namespace st = dtf::strategies;
  if (f.strategy == "hybrid" || f.strategy == "hybrid_sync") {
    st::hybrid_config c{.dense = {.rule = dtf::optim::sgd{f.lr}},
                        .tables = f.strategy == "hybrid" ? st::table_updates::asynchronous
                                                         : st::table_updates::synchronous};
    if (f.lr_decay == "cosine")
      c.dense.schedule = dtf::optim::cosine_decay{
          .learning_rate = f.lr, .decay_steps = std::max<std::int64_t>(steps, 1), .alpha = f.lr_floor};
    return train(st::hybrid(std::move(c)));
  }
  if (f.strategy == "sync_sgd") {
    const std::size_t n = f.sync_replicas ? f.sync_replicas : dtf::num_trainers(cluster);
    return train(st::sync_sgd({.replicas_to_aggregate = n, .rule = dtf::optim::sgd{f.lr}}));
  }
  if (f.strategy == "hogwild") return train(st::hogwild({.learning_rate = f.lr, .epoch_decay = 1.0f}));
  return train(st::downpour({.local_rule = dtf::optim::sgd{f.lr}, .ps_rule = dtf::optim::sgd{f.lr}}));
}

}  // namespace examples::recommender
