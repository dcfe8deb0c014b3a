// bench_torch_transformer_alone — the reference of benchmarks/torch_transformer.sh: the
// Transformer of examples/torch_transformer (model.hpp) trained by LibTorch alone, in one
// process, on the same examples of the same text (next_word's corpus.hpp, the same flags and
// defaults), for the same number of examples as the dtf jobs: --epochs passes over the first
// --train_examples, shuffled with --seed, in batches of --batch, torch::optim::Adam at --lr.
// The starting weights are the dtf job's (dtf::libtorch::module_model's initialize with --seed, the
// parameters dtf::train starts from), so the three runs differ only in how they train. Then the
// test perplexity (exp of the mean cross-entropy over the held-out verses, the module in eval
// mode) and the time: wall_s from the first step to the end of that evaluation, as the dtf
// RESULT line's wall_s (whose evaluation is also its last act).
//   RESULT scheme=libtorch_alone workers=1 examples=<n> accuracy=<a> wall_s=<s> perplexity=<p>
//
//   build/benchmarks/bench_torch_transformer_alone [--train_examples 0] [--epochs 1] [--batch 64]
//       [--lr 0.001] [--seed 42] [--threads 1] [--max_verses 0] [--vocabulary 4000] [--context 8]
#include <dtf/flags.hpp>
#include <dtf/torch/module_model.hpp>

#include "../examples/next_word/corpus.hpp"
#include "../examples/torch_transformer/model.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

namespace {

// A host batch of the corpus's dataset as LibTorch tensors: ids as floats [rows, context], as
// the module takes them (the dtf runs' input), and int64 labels.
std::pair<torch::Tensor, torch::Tensor> tensors_of(dtf::data::host_batch& b) {
  const auto rows = std::int64_t(b.labels.size());
  return {torch::from_blob(b.features.data(), {rows, std::int64_t(b.features.shape()[1])}, torch::kFloat),
          torch::from_blob(b.labels.data(), {rows}, torch::kInt).to(torch::kLong)};
}

}  // namespace

int main(int argc, char** argv) try {
  examples::text_flags text;
  text.context = 8;
  examples::transformer_sizes sizes;
  int train_examples = 0, epochs = 1, batch = 64, threads = 1;
  float lr = 1e-3f;
  std::uint64_t seed = 42;
  dtf::flag_parser flags("The torch_transformer model trained by LibTorch alone (one process), for reference.");
  text.add_to(flags);
  flags.add("train_examples", train_examples, "use only the first N training examples (0: all)")
      .add("epochs", epochs, "passes over the training examples").add("batch", batch, "examples per step")
      .add("lr", lr, "rate of the Adam update").add("seed", seed, "initialisation and shuffling")
      .add("threads", threads, "LibTorch's intra-op threads")
      .add("d_model", sizes.d_model, "width of the embeddings and the encoder")
      .add("heads", sizes.heads, "attention heads per layer").add("layers", sizes.layers, "encoder layers")
      .add("feedforward", sizes.feedforward, "hidden units of each layer's feed-forward block");
  if (!flags.parse(argc, argv)) return 0;
  if (epochs < 1 || batch < 1 || threads < 1)
    throw dtf::error(dtf::errc::invalid_config, "--epochs, --batch and --threads must be positive");

  const auto kjv = text.load();
  using examples::corpus;
  const auto C = std::size_t(text.context), V = kjv.vocabulary.size();
  sizes.vocabulary = std::int64_t(V), sizes.context = text.context;
  auto train = corpus::examples(kjv.train, C, V);
  if (train_examples > 0) train = train.take(std::size_t(train_examples));
  const auto test = corpus::examples(kjv.test, C, V).batch(1000);

  // The dtf jobs' starting weights: the adapter's seeded initialize leaves them in the module,
  // and the adapter goes (its hooks with it) before LibTorch trains the module alone.
  examples::TransformerLm net(sizes);
  {
    dtf::libtorch::module_model<examples::TransformerLm> start(net, {.threads = threads});
    std::vector<float> p(start.num_parameters());
    start.initialize(p, seed);
  }
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(lr));

  const auto t0 = std::chrono::steady_clock::now();
  auto stream = train.shuffle(seed).batch(std::size_t(batch)).repeat(epochs).prefetch(2).stream();  // as dtf's
  std::size_t trained = 0, steps = 0;
  net->train();
  while (auto b = stream.next()) {
    const auto [x, y] = tensors_of(*b);
    adam.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    adam.step();
    trained += b->labels.size();
    if (++steps % 200 == 0) std::printf("libtorch_alone: step=%zu loss=%.4f\n", steps, loss.item<float>());
  }
  double loss_sum = 0;
  std::size_t correct = 0, n = 0;
  {
    torch::NoGradGuard no_grad;
    net->eval();
    auto s = test.repeat(1).stream();
    while (auto b = s.next()) {
      const auto [x, y] = tensors_of(*b);
      const auto logits = net->forward(x);
      loss_sum += torch::nn::functional::cross_entropy(logits, y,
                      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
      correct += std::size_t(logits.argmax(1).eq(y).sum().item<std::int64_t>());
      n += b->labels.size();
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("RESULT scheme=libtorch_alone workers=1 examples=%zu accuracy=%.4f wall_s=%.1f perplexity=%.4f\n",
              trained, double(correct) / double(n), wall, std::exp(loss_sum / double(n)));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_torch_transformer_alone: %s\n", e.what());
  return 2;
}
