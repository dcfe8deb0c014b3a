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
  examples::transformer_flags f;  // model.hpp: the flags, --strategy's value checked
  if (!f.parse(argc, argv)) return 0;
  auto& tf = f.tf;
  auto& sizes = f.sizes;
  const float lr = f.lr;

  const dtf::cluster cluster = tf.resolve_cluster();
  const auto kjv = f.text.load();  // the vocabulary's ids are the network's
  sizes.vocabulary = std::int64_t(kjv.vocabulary.size()), sizes.context = f.text.context;
  using examples::corpus;
  auto train = corpus::examples(kjv.train, std::size_t(sizes.context), kjv.vocabulary.size());
  if (f.train_examples > 0) train = train.take(std::size_t(f.train_examples));
  dtf::libtorch::module_model<examples::TransformerLm> net(
      examples::TransformerLm(sizes), {.threads = tf.blas_threads, .seed = tf.train.seed,
                                       .task = dtf::trainer_index(cluster)});
  const auto test = corpus::examples(kjv.test, std::size_t(sizes.context), kjv.vocabulary.size()).batch(1000);
  auto options = tf.options(cluster, "torch_transformer_" + f.strategy);
  options.evaluate = examples::with_perplexity(dtf::evaluate_on(net, test));

  namespace s = dtf::strategies;  // the strategy line: Adam on the ps (DOWNPOUR: a push and a pull every step)
  auto run = [&](auto strategy) { return dtf::train(cluster, net, train, std::move(strategy), options, tf.partitioner()); };
  const auto r = f.collective() ? run(s::ring_allreduce<>({.rule = dtf::optim::adam{lr}}))
                                : run(s::downpour({1, 1, dtf::optim::sgd{lr}, dtf::optim::adam{lr}}));
  if (r.evaluation) examples::report_against_untrained(sizes, tf.train.seed, test, *r.evaluation);
  return r.exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "torch_transformer: %s\n", e.what());
  return 2;
}
