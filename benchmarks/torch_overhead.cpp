// bench_torch_overhead — what dtf::libtorch::module_model (include/dtf/torch/module_model.hpp) adds
// to a training step of plain LibTorch, in one process on one thread.
//
// The CNN of examples/torch_cnn (conv 32 / BN / ReLU / pool, conv 64 / BN / ReLU / pool, dropout,
// linear 128, linear 10; 421,834 parameters) twice, with the same weights, on the same fixed
// batch (the first --batch images of Fashion-MNIST's training set, x/255):
//   plain    LibTorch as its users write it: zero_grad, forward, cross_entropy, backward, and
//            the loss read out as a float (the adapter returns it too)
//   adapter  module_model::loss_and_gradients on fixed dtf buffers (std::vector<float> p, g):
//            the parameters copied in from p at each call, the gradients views of g for the
//            call (see the header)
// After --warmup steps of each, --rounds rounds of --steps steps of each, the two interleaved
// (plain first in odd rounds, adapter first in even ones) so that noise from other work hits
// both alike; every step is timed on its own. Before timing, the two are checked to compute the
// same thing: the adapter's logits (eval mode) equal the plain module's forward in eval mode.
// Prints the median ms per step of each, the overhead median(adapter)/median(plain) - 1, the
// range of the rounds' own ratios, and
//   RESULT torch_overhead plain_ms=<ms> adapter_ms=<ms> overhead_pct=<%> rounds=<r> steps=<s>
//
//   build-torch/benchmarks/bench_torch_overhead [--rounds 7] [--steps 30] [--warmup 10] [--batch 64]
//       [--data /usr/share/datasets/fashion-mnist]
#include <dtf/data/fashion_mnist.hpp>
#include <dtf/flags.hpp>
#include <dtf/host.hpp>
#include <dtf/torch/module_model.hpp>

#include "../examples/torch_cnn/cnn.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using examples::Cnn;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) try {
  int rounds = 7, steps = 30, warmup = 10, batch = 64;
  std::string dir = dtf::data::fashion_mnist_default_dir;
  dtf::flag_parser flags("Per-step cost of dtf::libtorch::module_model against plain LibTorch (the torch_cnn CNN, one thread).");
  flags.add("rounds", rounds, "rounds, each timing --steps steps of plain LibTorch and of the adapter")
      .add("steps", steps, "timed steps of each per round")
      .add("warmup", warmup, "untimed steps of each before the rounds")
      .add("batch", batch, "examples in the fixed batch")
      .add("data", dir, "directory holding the Fashion-MNIST IDX files");
  if (!flags.parse(argc, argv)) return 0;
  if (rounds < 1 || steps < 1 || batch < 1) {
    std::fprintf(stderr, "bench_torch_overhead: --rounds, --steps and --batch must be positive\n");
    return 2;
  }
  torch::set_num_threads(1);

  // The fixed batch, as dtf tensors (the adapter's input) and as LibTorch tensors (plain's:
  // [batch, 1, 28, 28] float32 and int64 labels, as a LibTorch program would hold them).
  auto first = *dtf::data::load_fashion_mnist(dtf::data::split::train, dir)
                    .normalize()
                    .batch(std::size_t(batch))
                    .stream()
                    .next();
  dtf::tensor x, y;
  dtf::assign_from_host(x, first.features);
  dtf::assign_from_host(y, first.labels);
  const auto tx = torch::from_blob(first.features.data(), {batch, 1, 28, 28}, torch::kFloat).clone();
  const auto ty = torch::from_blob(first.labels.data(), {batch}, torch::kInt).to(torch::kLong);

  // The adapter, its buffers filled from seed 1; the plain module gets the same weights.
  dtf::libtorch::module_model<Cnn> net(Cnn(), {.input_shape = {1, 28, 28}, .threads = 1, .seed = 1});
  std::vector<float> p(net.num_parameters()), g(net.num_parameters());
  net.initialize(p, 1);
  Cnn plain;
  {
    torch::NoGradGuard no_grad;
    const auto vars = net.variables();
    auto params = plain->named_parameters(/*recurse=*/true);
    if (params.size() != vars.size()) throw std::runtime_error("the two modules differ in their parameters");
    for (std::size_t i = 0; i < vars.size(); ++i) {
      auto t = params[vars[i].name];
      if (std::size_t(t.numel()) != vars[i].size()) throw std::runtime_error("parameter " + vars[i].name + " differs");
      std::memcpy(t.data_ptr<float>(), p.data() + vars[i].offset, vars[i].size_bytes());
    }
  }
  plain->train();

  // Check: the same function (eval mode: no dropout, BatchNorm's running statistics, which
  // both modules still have at their initial values).
  {
    dtf::tensor z;
    net.logits(p, x, z);
    torch::NoGradGuard no_grad;
    plain->eval();
    const auto zp = plain->forward(tx).contiguous();
    plain->train();
    double worst = 0;
    for (std::size_t i = 0; i < z.size(); ++i)
      worst = std::max(worst, double(std::fabs(z.data<float>()[i] - zp.data_ptr<float>()[i])));
    if (std::size_t(zp.numel()) != z.size() || worst > 1e-5) {
      std::fprintf(stderr, "bench_torch_overhead: the adapter's logits differ from plain LibTorch's (max |diff| %g)\n",
                   worst);
      return 1;
    }
  }

  using clock = std::chrono::steady_clock;
  volatile float sink = 0;
  auto plain_step = [&] {
    plain->zero_grad();
    auto loss = torch::nn::functional::cross_entropy(plain->forward(tx), ty);
    loss.backward();
    sink = sink + loss.item<float>();
  };
  auto adapter_step = [&] { sink = sink + net.loss_and_gradients(p, x, y, g); };
  auto time_steps = [&](auto& step, std::vector<double>& all, std::vector<double>& round) {
    round.clear();
    for (int i = 0; i < steps; ++i) {
      const auto t0 = clock::now();
      step();
      const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
      all.push_back(ms);
      round.push_back(ms);
    }
  };
  for (int i = 0; i < warmup; ++i) plain_step(), adapter_step();
  std::vector<double> plain_ms, adapter_ms, round_a, round_b, ratios;
  for (int r = 1; r <= rounds; ++r) {
    if (r % 2) {
      time_steps(plain_step, plain_ms, round_a);
      time_steps(adapter_step, adapter_ms, round_b);
    } else {
      time_steps(adapter_step, adapter_ms, round_b);
      time_steps(plain_step, plain_ms, round_a);
    }
    ratios.push_back(median(round_b) / median(round_a));
    std::printf("round %d/%d: plain %.3f ms  adapter %.3f ms  (%+.1f%%)\n", r, rounds, median(round_a),
                median(round_b), 100 * (ratios.back() - 1));
  }
  const double a = median(plain_ms), b = median(adapter_ms);
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf("plain LibTorch (zero_grad, forward, cross_entropy, backward): median %.3f ms/step\n", a);
  std::printf("dtf::libtorch::module_model::loss_and_gradients:                   median %.3f ms/step\n", b);
  std::printf("overhead: %+.2f%% (rounds' own: median %+.2f%%, %+.2f%% to %+.2f%%); %d rounds x %d steps, batch %d, "
              "1 thread\n",
              100 * (b / a - 1), 100 * (median(ratios) - 1), 100 * (*lo - 1), 100 * (*hi - 1), rounds, steps, batch);
  std::printf("RESULT torch_overhead plain_ms=%.3f adapter_ms=%.3f overhead_pct=%.2f rounds=%d steps=%d\n", a, b,
              100 * (b / a - 1), rounds, steps);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_torch_overhead: %s\n", e.what());
  return 2;
}
