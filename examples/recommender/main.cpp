// recommender — a DLRM-style click model of Criteo display-ads logs (model.hpp): the 26
// categorical columns through a hashed embedding table sharded over the ps (64-bit ids, rows
// created on first use, Adagrad per row on the ps), the 13 numeric features and the rows' pairwise
// dot products under a dense MLP, plus a wide part (each id's weight, the numeric features'
// linear term, the pairs' sum) straight to one logistic output. Trained by the hybrid strategy
// (the table on the ps, the dense MLP by ring-allreduce among the workers), or through the ps by SyncSGD,
// Hogwild or DOWNPOUR (setup.hpp: flags, logs, strategies); the chief reports the held-out AUC
// and log loss (dtf/metrics/binary_eval.hpp), and on synthetic logs the planted model's own,
// the best any model of those logs can reach.
//   dtfrun --ps 2 --workers 4 -- build/examples/recommender --strategy hybrid   # 1M synthetic lines
//   dtfrun --ps 2 --workers 4 -- build/examples/recommender --data day_0.gz --max_examples 2000000
// recommender_torch is this program with the dense tower written in LibTorch (torch_model.hpp).
#include "setup.hpp"
#ifdef RECOMMENDER_TORCH
#include "torch_model.hpp"
#endif

#include <cstdio>

int main(int argc, char** argv) try {
  using namespace examples::recommender;
  dtf::train_flags tf;
  tf.train.epochs = 5;
  tf.train.batch = 256;
  tf.train.log_every = 100;
  recommender_flags f;
  dtf::flag_parser flags("Trains a DLRM-style click model of Criteo logs, its embedding table on the ps.");
  tf.add_to(flags);
  f.add_to(flags);
  if (!flags.parse(argc, argv)) return 0;
  f.check();
  if (save_synthetic(f)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const logs data = load_logs(f, cluster);
#ifdef RECOMMENDER_TORCH
  torch_dlrm net(torch_top(f.model), torch_dlrm_input(f.model), {.threads = tf.blas_threads});
#else
  dlrm net(f.model);
#endif

  auto options = tf.options(cluster, "recommender_" + f.strategy);
  options.embedding_rule = dtf::optim::adagrad{.learning_rate = f.embedding_lr};
  const auto held_out = evaluate_held_out(cluster, net, data, options);
  // Each worker trains on its 1/N of the examples (the span of --lr_decay).
  const std::size_t per_worker = (data.train.size() + dtf::num_trainers(cluster) - 1) / dtf::num_trainers(cluster);
  const auto steps = std::int64_t(tf.train.epochs * ((per_worker + tf.train.batch - 1) / tf.train.batch));
  const dtf::train_result r = train_with(f, cluster, steps, [&](auto strategy) {
    return dtf::train(cluster, net, data.train, std::move(strategy), options, tf.partitioner());
  });

  return report(f, data, *held_out, r);
} catch (const std::exception& e) {
  std::fprintf(stderr, "recommender: %s\n", e.what());
  return 2;
}
