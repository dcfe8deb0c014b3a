// torch_transformer — a small Transformer language model written with LibTorch's modules (word
// and position embeddings, TransformerEncoder, a linear head; model.hpp) made a dtf model by
// dtf::libtorch::module_model, trained to predict the next word of next_word's King James text by
// a dtf strategy. The chief prints the test perplexity on its RESULT line (perplexity=...), then
// beside the untrained model's and the uniform distribution's:
//   apt-get install bible-kjv bible-kjv-text
//   dtfrun --workers 2 -- build/examples/torch_transformer --strategy ring_allreduce
//   dtfrun --ps 1 --workers 2 -- build/examples/torch_transformer --strategy downpour
#include <dtf/dtf.hpp>
#include <dtf/torch/module_model.hpp>

#include "../next_word/corpus.hpp"
#include "model.hpp"

#include <cstdio>
#include <string>
#include <utility>

int main(int argc, char** argv) try {
  std::string strategy = "ring_allreduce";  // the --strategy flag's value decides the flag set, so look first
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--strategy") strategy = argv[i + 1];
  const bool collective = strategy == "ring_allreduce";
  dtf::train_flags tf;
  tf.train.epochs = 1;
  tf.train.batch = 64;
  tf.train.log_every = 200;
  examples::text_flags text;
  text.context = 8;
  examples::transformer_sizes sizes;
  int train_examples = 0;
  float lr = 1e-3f;
  dtf::flag_parser flags("Trains a LibTorch Transformer next-word model of the King James Bible with a dtf strategy.");
  tf.add_to(flags, collective ? dtf::train_flag_set::collective : dtf::train_flag_set::ps);
  text.add_to(flags);
  flags.add("strategy", strategy, "ring_allreduce or downpour").add("lr", lr, "rate of the Adam update")
      .add("train_examples", train_examples, "use only the first N training examples (0: all)")
      .add("d_model", sizes.d_model, "width of the embeddings and the encoder")
      .add("heads", sizes.heads, "attention heads per layer").add("layers", sizes.layers, "encoder layers")
      .add("feedforward", sizes.feedforward, "hidden units of each layer's feed-forward block");
  if (!flags.parse(argc, argv)) return 0;
  if (!collective && strategy != "downpour")
    throw dtf::error(dtf::errc::invalid_config, "--strategy: '" + strategy + "' is not ring_allreduce or downpour");

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto kjv = text.load();  // the vocabulary's ids are the network's
  sizes.vocabulary = std::int64_t(kjv.vocabulary.size()), sizes.context = text.context;
  using examples::corpus;
  auto train = corpus::examples(kjv.train, std::size_t(sizes.context), kjv.vocabulary.size());
  if (train_examples > 0) train = train.take(std::size_t(train_examples));
  dtf::libtorch::module_model<examples::TransformerLm> net(
      examples::TransformerLm(sizes), {.threads = tf.blas_threads, .seed = tf.train.seed,
                                       .task = dtf::trainer_index(cluster)});
  const auto test = corpus::examples(kjv.test, std::size_t(sizes.context), kjv.vocabulary.size()).batch(1000);
  auto options = tf.options(cluster, "torch_transformer_" + strategy);
  options.evaluate = examples::with_perplexity(dtf::evaluate_on(net, test));

  namespace s = dtf::strategies;  // the strategy line: Adam on the ps (DOWNPOUR: a push and a pull every step)
  auto run = [&](auto strategy) { return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()); };
  const auto r = collective ? run(s::ring_allreduce<>({.rule = dtf::optim::adam{lr}}))
                            : run(s::downpour({1, 1, dtf::optim::sgd{lr}, dtf::optim::adam{lr}}));
  if (r.evaluation) examples::report_against_untrained(sizes, tf.train.seed, test, *r.evaluation);
  return r.exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "torch_transformer: %s\n", e.what());
  return 2;
}
