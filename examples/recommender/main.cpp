// recommender — a DLRM-style click model of Criteo display-ads logs (model.hpp): the 26
// categorical columns through a hashed embedding table sharded over the ps (64-bit ids, rows
// created on first use, Adagrad per row on the ps), the 13 numeric features and the rows' pairwise
// dot products under a dense MLP, a logistic output. Trained through the ps by SyncSGD (every
// step's rows and dense gradients averaged over the workers), Hogwild or DOWNPOUR; the chief
// reports the held-out AUC and log loss (dtf/metrics/binary_eval.hpp), and on synthetic logs
// the planted model's own, the best any model of those logs can reach.
//   dtfrun --ps 2 --workers 4 -- build/examples/recommender --synthetic 200000
//   dtfrun --ps 2 --workers 4 -- build/examples/recommender --data day_0.gz --max_examples 2000000
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
#include <utility>

namespace {

// "64,32" -> {64, 32}; "" -> no hidden layer.
std::vector<std::size_t> parse_widths(const std::string& s) {
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

}  // namespace

int main(int argc, char** argv) try {
  using namespace examples::recommender;
  dtf::train_flags tf;
  tf.train.epochs = 2;
  tf.train.batch = 256;
  tf.train.log_every = 100;
  std::string data_path, save_synthetic, strategy = "sync_sgd", hidden = "64,32";
  std::size_t synthetic = 100000, vocabulary = 100, max_examples = 0, sync_replicas = 0;
  std::uint64_t data_seed = 1;
  double test_fraction = 0.1, target_auc = 0;
  bool skip_malformed = false;
  dlrm_config model_config;
  float lr = 0.1f, embedding_lr = 1.0f;
  dtf::flag_parser flags("Trains a DLRM-style click model of Criteo logs, its embedding table on the ps.");
  tf.add_to(flags);
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
      .add("embedding_lr", embedding_lr, "Adagrad step size of the embedding rows on the ps")
      .add("dim", model_config.dim, "floats per embedding row")
      .add("hidden", hidden, "widths of the MLP's hidden layers, comma-separated")
      .add("max_rows", model_config.max_rows, "rows the hashed table holds at most, over all ps")
      .add("evict_after", model_config.evict_after, "evict rows unseen for this many shard updates (0: never)")
      .add("target_auc", target_auc, "chief: exit with status 1 if the held-out AUC is lower");
  if (!flags.parse(argc, argv)) return 0;
  if (strategy != "hybrid" && strategy != "hybrid_sync" && strategy != "sync_sgd" && strategy != "hogwild" &&
      strategy != "downpour")
    throw dtf::error(dtf::errc::invalid_config, "--strategy: unknown '" + strategy +
                                                    "' (expected hybrid, hybrid_sync, sync_sgd, hogwild or downpour)");
  if (!(test_fraction > 0 && test_fraction < 1))
    throw dtf::error(dtf::errc::invalid_config, "--test_fraction: must be in (0, 1)");
  model_config.hidden = parse_widths(hidden);
  if (!save_synthetic.empty()) {  // the same logs for another program (benchmarks/recommender.sh's TensorFlow peer)
    const bool gz = save_synthetic.size() > 3 && save_synthetic.ends_with(".gz");
    dtf::data::synthetic_criteo({.examples = synthetic, .seed = data_seed, .vocabulary = vocabulary})
        .write(save_synthetic, gz);
    std::printf("recommender: wrote %zu synthetic lines to %s\n", synthetic, save_synthetic.c_str());
    return 0;
  }

  const dtf::cluster cluster = tf.resolve_cluster();
  const bool is_ps = cluster.self.job == "ps";
  // The logs (a ps trains nothing: it reads none). Synthetic logs keep the planted model's
  // probabilities, whose held-out AUC and log loss are the best reachable.
  dtf::data::criteo_columns logs;
  std::optional<dtf::data::criteo_synthetic> planted;
  if (is_ps) {
    logs.labels.assign(1, 0.0f);
    logs.dense.assign(criteo_dense_columns, 0.0f);
    logs.ids.assign(criteo_categorical_columns, 0);
  } else if (!data_path.empty()) {
    logs = dtf::data::read_criteo(data_path, {.skip_malformed = skip_malformed, .max_examples = max_examples});
    if (logs.skipped)
      std::printf("%s: skipped %zu malformed lines (the first: %s)\n", cluster.self.str().c_str(), logs.skipped,
                  logs.first_skipped.c_str());
  } else {
    planted = dtf::data::synthetic_criteo({.examples = synthetic, .seed = data_seed, .vocabulary = vocabulary});
    logs = planted->columns();
  }
  const std::size_t n = logs.size();
  const std::size_t split = is_ps ? n : n - std::size_t(double(n) * test_fraction);
  if (!is_ps && (split == 0 || split == n))
    throw dtf::error(dtf::errc::invalid_config, std::to_string(n) + " examples leave no training or no test set");

  dlrm net(model_config);
  auto options = tf.options(cluster, "recommender_" + strategy);
  options.embedding_rule = dtf::optim::adagrad{.learning_rate = embedding_lr};
  auto last = std::make_shared<dtf::metrics::binary_metrics>();
  double best_auc = 0, best_log_loss = 0;
  if (!is_ps) {
    options.evaluate_rows = dtf::metrics::binary_evaluate_on(net, to_dataset(logs, split, n).batch(4096), last);
    if (planted) {
      const std::span<const float> p(planted->click_probability), y(planted->labels);
      best_auc = dtf::metrics::auc(p.subspan(split), y.subspan(split));
      best_log_loss = dtf::metrics::log_loss(p.subspan(split), y.subspan(split));
      char extra[96];
      std::snprintf(extra, sizeof extra, "best_auc=%.4f best_log_loss=%.4f", best_auc, best_log_loss);
      options.result_extra = extra;
    }
  }
  const auto train_set = to_dataset(logs, 0, is_ps ? n : split);
  logs = {};  // the datasets hold their own copies
  if (planted) planted.reset();

  auto train = [&](auto s) { return dtf::train(cluster, net, train_set, std::move(s), options, tf.partitioner()); };
  dtf::train_result r;
  if (strategy == "hybrid" || strategy == "hybrid_sync") {
    namespace st = dtf::strategies;
    r = train(st::hybrid({.dense = {.rule = dtf::optim::sgd{lr}},
                          .tables = strategy == "hybrid" ? st::table_updates::asynchronous
                                                         : st::table_updates::synchronous}));
  } else if (strategy == "sync_sgd") {
    const std::size_t trainers = dtf::num_trainers(cluster);
    r = train(dtf::strategies::sync_sgd({.replicas_to_aggregate = sync_replicas ? sync_replicas : trainers,
                                         .rule = dtf::optim::sgd{lr}}));
  } else if (strategy == "hogwild") {
    r = train(dtf::strategies::hogwild({.learning_rate = lr, .epoch_decay = 1.0f}));
  } else {
    r = train(dtf::strategies::downpour({.local_rule = dtf::optim::sgd{lr}, .ps_rule = dtf::optim::sgd{lr}}));
  }
  if (r.evaluation && last->examples > 0) {
    std::printf("recommender: held-out AUC %.4f, log loss %.4f over %llu examples", last->auc, last->log_loss,
                static_cast<unsigned long long>(last->examples));
    if (best_auc > 0) std::printf(" (the planted model's: AUC %.4f, log loss %.4f)", best_auc, best_log_loss);
    std::printf("\n");
    std::fflush(stdout);
    if (target_auc > 0 && !(last->auc >= target_auc)) {
      std::fprintf(stderr, "recommender: held-out AUC %.4f is below the target %.4f\n", last->auc, target_auc);
      return 1;
    }
  }
  return r.exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "recommender: %s\n", e.what());
  return 2;
}
