// torch_transformer's network and its helpers. The network: a small Transformer encoder over
// the previous `context` words of next_word's King James text (word embedding plus a learned
// position embedding, LibTorch's TransformerEncoder of post-norm layers, no dropout), whose
// last position's output a linear layer maps to logits over the vocabulary. Also
// benchmarks/torch_transformer_alone.cpp's (the same network trained by LibTorch alone).
//
// Also main.cpp's flags (transformer_flags) and its last line (report_against_untrained).
//
// Token ids travel as floats (dtf's features are float32; ids below 2^24 are exact) and become
// int64 in forward. Every layer is a LibTorch built-in, so dtf::libtorch::module_model draws them
// all from the job's seed.
#pragma once

#include <dtf/data/dataset.hpp>
#include <dtf/error.hpp>
#include <dtf/flags.hpp>
#include <dtf/nn/evaluate.hpp>
#include <dtf/torch/module_model.hpp>
#include <dtf/train_flags.hpp>

#include "../next_word/corpus.hpp"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace examples {

/// The network's sizes.
struct transformer_sizes {
  std::int64_t vocabulary = 4000, context = 8, d_model = 64, heads = 2, layers = 2, feedforward = 128;
};

struct TransformerLmImpl : torch::nn::Cloneable<TransformerLmImpl> {  // Cloneable: mirrored copies it
  explicit TransformerLmImpl(transformer_sizes s) : sizes(s) { reset(); }
  void reset() override {
    namespace tnn = torch::nn;
    words = register_module("words", tnn::Embedding(sizes.vocabulary, sizes.d_model));
    positions = register_module("positions", tnn::Embedding(sizes.context, sizes.d_model));
    encoder = register_module(
        "encoder", tnn::TransformerEncoder(tnn::TransformerEncoderOptions(
                       tnn::TransformerEncoderLayerOptions(sizes.d_model, sizes.heads)
                           .dim_feedforward(sizes.feedforward)
                           .dropout(0.0),
                       sizes.layers)));
    head = register_module("head", tnn::Linear(sizes.d_model, sizes.vocabulary));
  }
  /// x: [batch, context] word ids as floats (the last column the previous word). Returns
  /// [batch, vocabulary] logits of the next word.
  torch::Tensor forward(torch::Tensor x) {
    const auto ids = x.to(torch::kLong);
    const auto at = torch::arange(sizes.context, torch::TensorOptions().dtype(torch::kLong));
    auto h = words->forward(ids) + positions->forward(at);  // [batch, context, d_model]
    h = encoder->forward(h.transpose(0, 1));                // LibTorch 1.13's layers take [seq, batch, d]
    return head->forward(h[sizes.context - 1]);             // the last position: the next word
  }
  transformer_sizes sizes;
  torch::nn::Embedding words{nullptr}, positions{nullptr};
  torch::nn::TransformerEncoder encoder{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TransformerLm);

/// main.cpp's command line: the standard training flags (the collective or the ps set, as
/// --strategy says), the text's, the network's sizes and the rate.
struct transformer_flags {
  std::string strategy = "ring_allreduce";
  dtf::train_flags tf;
  text_flags text;
  transformer_sizes sizes;
  int train_examples = 0;
  float lr = 1e-3f;

  bool collective() const { return strategy == "ring_allreduce"; }

  /// Parses the command line; false when the program should exit (--help). Errors:
  /// errc::invalid_config for a --strategy other than ring_allreduce or downpour.
  bool parse(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; ++i)  // the --strategy flag's value decides the flag set, so look first
      if (std::string(argv[i]) == "--strategy") strategy = argv[i + 1];
    tf.train.epochs = 1;
    tf.train.batch = 64;
    tf.train.log_every = 200;
    text.context = 8;
    dtf::flag_parser flags("Trains a LibTorch Transformer next-word model of the King James Bible with a dtf strategy.");
    tf.add_to(flags, collective() ? dtf::train_flag_set::collective : dtf::train_flag_set::ps);
    text.add_to(flags);
    flags.add("strategy", strategy, "ring_allreduce or downpour").add("lr", lr, "rate of the Adam update")
        .add("train_examples", train_examples, "use only the first N training examples (0: all)")
        .add("d_model", sizes.d_model, "width of the embeddings and the encoder")
        .add("heads", sizes.heads, "attention heads per layer").add("layers", sizes.layers, "encoder layers")
        .add("feedforward", sizes.feedforward, "hidden units of each layer's feed-forward block");
    if (!flags.parse(argc, argv)) return false;
    if (!collective() && strategy != "downpour")
      throw dtf::error(dtf::errc::invalid_config, "--strategy: '" + strategy + "' is not ring_allreduce or downpour");
    return true;
  }
};

/// The test perplexity, exp of the mean test cross-entropy, added to an evaluation's figures
/// (so that the RESULT line ends in perplexity=...).
inline std::function<dtf::nn::evaluation(std::span<const float>)> with_perplexity(
    std::function<dtf::nn::evaluation(std::span<const float>)> evaluate) {
  return [evaluate = std::move(evaluate)](std::span<const float> p) {
    auto e = evaluate(p);
    e.metrics.emplace_back("perplexity", std::exp(e.loss));
    return e;
  };
}

/// The chief's last line: the trained model's test perplexity beside the untrained model's
/// (the parameters dtf::train started from: a fresh network initialised with the job's seed) and
/// the uniform distribution's (the vocabulary's size).
inline void report_against_untrained(const transformer_sizes& sizes, std::uint64_t seed, const dtf::data::dataset& test,
                                     const dtf::nn::evaluation& trained) {
  dtf::libtorch::module_model<TransformerLm> fresh(TransformerLm(sizes), {.seed = seed});
  std::vector<float> p(fresh.num_parameters());
  fresh.initialize(p, seed);
  std::printf("torch_transformer: test perplexity %.1f trained, %.1f untrained, %lld uniform (%zu parameters)\n",
              std::exp(trained.loss), std::exp(dtf::nn::evaluate(fresh, p, test).loss),
              static_cast<long long>(sizes.vocabulary), fresh.num_parameters());
}

}  // namespace examples
