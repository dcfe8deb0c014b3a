// next_word — a word-embedding language model of the King James Bible (Bengio et al. 2003: the
// previous words' embeddings, concatenated, under a hidden layer and a softmax), its vocabulary
// table sharded over the ps as a sparse variable. Each step a worker gathers only its batch's
// rows and pushes only their gradients (Adagrad per row on the ps); the dense layers train with
// Hogwild, or with --sync_replicas N SyncSGD (rows and dense gradients averaged over N workers).
// The chief reports the held-out perplexity beside a unigram and a Kneser-Ney bigram (corpus.hpp).
//   apt-get install bible-kjv bible-kjv-text; dtfrun --ps 2 --workers 2 -- build/examples/next_word
#include <dtf/dtf.hpp>
#include <dtf/nn/embedding_sequential.hpp>
#include <dtf/strategies/hogwild.hpp>
#include <dtf/strategies/sync.hpp>

#include "corpus.hpp"

#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  tf.train.epochs = 4;
  tf.train.batch = 128;
  tf.train.log_every = 500;
  examples::text_flags text;
  dtf::strategies::hogwild_config c{.learning_rate = 0.3f, .epoch_decay = 0.8f};
  int dim = 48, hidden = 192;
  float embedding_lr = 0.5f;
  std::size_t sync_replicas = 0;
  dtf::flag_parser flags("Trains a next-word model of the King James Bible, its word embeddings on the ps.");
  tf.add_to(flags);
  text.add_to(flags);
  flags.add("dim", dim, "floats per word embedding").add("hidden", hidden, "hidden units")
      .add("lr", c.learning_rate, "SGD step size of the dense layers on the ps")
      .add("epoch_decay", c.epoch_decay, "per-epoch step-size factor")
      .add("embedding_lr", embedding_lr, "Adagrad step size of the embedding rows on the ps")
      .add("sync_replicas", sync_replicas, "0: Hogwild; N > 0: SyncSGD averaging N workers a step (SGD at --lr)");
  if (!flags.parse(argc, argv)) return 0;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto corpus = text.load();
  const std::size_t V = corpus.vocabulary.size(), C = std::size_t(text.context), D = std::size_t(dim);
  using namespace dtf::nn;
  embedding_sequential net({.table = {.name = "words", .rows = V, .dim = std::uint32_t(D), .init = {.scale = 0.1f}},
                            .ids_per_example = C},
                           sequential{dense(C * D, std::size_t(hidden)), relu(), dense(std::size_t(hidden), V)});
  auto options = tf.options(cluster, "next_word");
  options.evaluate_rows = dtf::evaluate_on(net, examples::corpus::examples(corpus.test, C, V).batch(1000));
  options.embedding_rule = dtf::optim::adagrad{.learning_rate = embedding_lr};
  const auto base = cluster.is_chief() ? examples::report_baselines(corpus) : examples::baselines{};
  options.result_extra = base.result_extra();
  auto train = [&](auto strategy) {
    return dtf::train(cluster, net, examples::corpus::examples(corpus.train, C, V), strategy, options, tf.partitioner());
  };
  const auto r = sync_replicas == 0 ? train(dtf::strategies::hogwild(c))
                                    : train(dtf::strategies::sync_sgd({.replicas_to_aggregate = sync_replicas,
                                                                       .rule = dtf::optim::sgd{c.learning_rate}}));
  if (r.evaluation) base.print_against(*r.evaluation);
  return r.exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "next_word: %s\n", e.what());
  return 2;
}
