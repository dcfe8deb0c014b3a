// next_word — a word-embedding language model of the King James Bible, its vocabulary table
// sharded over the parameter servers as a sparse variable (Bengio et al. 2003's model: the
// embeddings of the previous words, concatenated, under a hidden layer and a softmax).
//   apt-get install bible-kjv bible-kjv-text
//   dtfrun --ps 2 --workers 2 -- build/examples/next_word
// Each step a worker gathers only the rows of the words its batch holds and pushes only their
// gradients (Adagrad on the ps, lazily per row); the dense layers train with the scheme chosen
// (--scheme hogwild or downpour). The chief reports the held-out perplexity beside a unigram and
// an interpolated Kneser-Ney bigram fitted by this program on the same training verses.
#include <dtf/dtf.hpp>
#include <dtf/nn/embedding_sequential.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/hogwild.hpp>

#include "corpus.hpp"

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) try {
  dtf::train_flags tf;
  tf.train.epochs = 4;
  tf.train.batch = 128;
  tf.train.log_every = 500;
  std::string text, scheme = "hogwild";
  int vocabulary = 4000, context = 3, dim = 48, hidden = 192, max_verses = 0;
  float lr = 0.3f, embedding_lr = 0.5f, epoch_decay = 0.8f;
  bool require_better_than_bigram = false;
  dtf::flag_parser flags("Trains a next-word model of the King James Bible, its word embeddings on the ps.");
  tf.add_to(flags);
  flags.add("text", text, "verses, one per line after its number (default: the output of 'bible -l100000 Gen1:1-Rev22:21')")
      .add("max_verses", max_verses, "use only the first N verses (0: all)")
      .add("vocabulary", vocabulary, "words in the vocabulary, </s> and <unk> included")
      .add("context", context, "previous words the model sees")
      .add("dim", dim, "floats per word embedding")
      .add("hidden", hidden, "hidden units")
      .add("scheme", scheme, "hogwild or downpour (the dense layers' scheme)")
      .add("lr", lr, "step size of the dense layers (hogwild: SGD on the ps; downpour: the workers' SGD)")
      .add("epoch_decay", epoch_decay, "hogwild: per-epoch step-size factor")
      .add("embedding_lr", embedding_lr, "Adagrad step size of the embedding rows on the ps")
      .add("require_better_than_bigram", require_better_than_bigram,
           "chief: exit with status 1 unless the model's perplexity is below the bigram's");
  if (!flags.parse(argc, argv)) return 0;
  if (context < 1 || dim < 1 || hidden < 1) throw dtf::error(dtf::errc::invalid_config, "--context, --dim and --hidden must be positive");

  const dtf::cluster cluster = tf.resolve_cluster();
  auto verses = examples::read_verses(text);
  if (max_verses > 0 && std::size_t(max_verses) < verses.size()) verses.resize(std::size_t(max_verses));
  const examples::corpus corpus(verses, std::size_t(vocabulary));
  const std::size_t V = corpus.vocabulary.size(), C = std::size_t(context), D = std::size_t(dim);
  const auto train = examples::corpus::examples(corpus.train, C, V);
  const auto test = examples::corpus::examples(corpus.test, C, V).batch(1000);

  using namespace dtf::nn;
  embedding_sequential net({.table = {.name = "words", .rows = V, .dim = std::uint32_t(D), .init = {.scale = 0.1f}},
                            .ids_per_example = C},
                           sequential{dense(C * D, std::size_t(hidden)), relu(), dense(std::size_t(hidden), V)});
  auto options = tf.options(cluster, "next_word_" + scheme);
  options.evaluate_rows = dtf::evaluate_on(net, test);
  options.embedding_rule = dtf::optim::adagrad{.learning_rate = embedding_lr};
  const bool chief = cluster.is_chief();
  examples::baselines base;
  if (chief) {
    base = examples::ngram_baselines(corpus);
    std::printf("next_word: %zu training verses (%zu tokens), %zu held out (%zu tokens, %.1f%% <unk>); vocabulary %zu; "
                "held-out perplexity of the unigram %.1f, of the Kneser-Ney bigram %.1f\n",
                corpus.train.size(), corpus.train_tokens, corpus.test.size(), corpus.test_tokens,
                100 * corpus.test_unknown, V, base.unigram, base.bigram);
    std::fflush(stdout);
    char extra[96];
    std::snprintf(extra, sizeof extra, "unigram_ppl=%.1f bigram_ppl=%.1f", base.unigram, base.bigram);
    options.result_extra = extra;
  }
  dtf::train_result r;
  if (scheme == "hogwild") {
    options.learning_rate = [&](std::int64_t, std::size_t epoch) { return double(lr) * std::pow(double(epoch_decay), double(epoch)); };
    r = dtf::train(cluster, net, train, dtf::strategies::hogwild({.learning_rate = lr, .epoch_decay = epoch_decay}), options,
                   tf.partitioner());
  } else if (scheme == "downpour") {
    r = dtf::train(cluster, net, train, dtf::strategies::downpour({.local_rule = dtf::optim::sgd{lr}}), options, tf.partitioner());
  } else {
    throw dtf::error(dtf::errc::invalid_config, "--scheme: '" + scheme + "' is neither hogwild nor downpour");
  }
  if (chief && r.evaluation) {
    const double ppl = std::exp(r.evaluation->loss);
    std::printf("next_word: held-out perplexity: model %.1f, bigram %.1f, unigram %.1f (next-word accuracy %.3f)\n", ppl,
                base.bigram, base.unigram, r.evaluation->accuracy);
    std::fflush(stdout);
    if (require_better_than_bigram && !(ppl < base.bigram)) {
      std::fprintf(stderr, "next_word: the model's perplexity %.1f is not below the bigram's %.1f\n", ppl, base.bigram);
      return 1;
    }
  }
  return r.exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "next_word: %s\n", e.what());
  return 2;
}
