// bench_train_peers_dtf — dtf's side of benchmarks/train_peers.sh: samples/s of one training
// step (forward, softmax cross-entropy, backward, Adam) of an MLP on resident batches, and the
// core's single-precision GEMM peak. train_peers.py runs the same measurement in PyTorch and
// TensorFlow; the script interleaves the three.
//
//   bench_train_peers_dtf --hidden 256,128 --batch 64 --threads 1 --seconds 3
//   bench_train_peers_dtf --gemm_peak 2048 --threads 1
#include <dtf/dtf.hpp>

#include "mlp_widths.hpp"

#include <chrono>
#include <cstdio>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;
}  // namespace

int main(int argc, char** argv) try {
  using namespace dtf;
  std::string hidden = "256,128";
  int batch = 64, threads = 1, gemm_peak = 0, inputs = 784, classes = 10;
  double seconds = 3.0;
  flag_parser flags("dtf's training step in samples/s beside PyTorch and TensorFlow (benchmarks/train_peers.sh).");
  flags.add("hidden", hidden, "hidden layer widths, comma-separated")
      .add("batch", batch, "batch size")
      .add("threads", threads, "BLAS threads")
      .add("seconds", seconds, "timed seconds (after one warm-up second)")
      .add("gemm_peak", gemm_peak, "instead: time sgemm n x n x n and print its GFLOP/s (n > 0)");
  if (!flags.parse(argc, argv)) return 0;
  set_cpu_threads({.device = 1, .blas = threads});

  if (gemm_peak > 0) {
    const std::size_t n = std::size_t(gemm_peak);
    tensor a({n, n}), b({n, n}), c({n, n});
    std::vector<float> v(n * n);
    nn::splitmix64 rng(1);
    for (auto& x : v) x = float(rng.uniform());
    a.copy_from_host<float>(v);
    b.copy_from_host<float>(v);
    auto once = [&] {
      dtf::detail::gemm(dtf::detail::transpose::no, dtf::detail::transpose::no, n, n, n, 1.0f, a.data<float>(), n,
                        b.data<float>(), n, 0.0f, c.data<float>(), n);
    };
    once();
    double best = 0;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = clock_type::now();
      once();
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      best = std::max(best, 2.0 * double(n) * double(n) * double(n) / s / 1e9);
    }
    std::printf("gemm_peak n=%zu threads=%d gflops=%.2f\n", n, threads, best);
    return 0;
  }

  // The same MLP as train_peers.py: Dense+ReLU per hidden layer, Dense logits.
  const auto widths = bench::layer_widths(std::size_t(inputs), hidden, std::size_t(classes));
  auto net = bench::mlp(widths);
  tensor p({net.num_parameters()}), g({net.num_parameters()});
  net.initialize(p.span<float>(), 1);
  optim::optimizer<> opt(optim::adam{}, net.num_parameters());
  // 16 resident batches of seeded inputs in [0, 1) and labels, cycled.
  const std::size_t rows = std::size_t(batch);
  std::vector<tensor> xs, ys;
  nn::splitmix64 rng(7);
  for (int i = 0; i < 16; ++i) {
    std::vector<float> x(rows * widths[0]);
    for (auto& v : x) v = float(rng.uniform());
    std::vector<std::int32_t> y(rows);
    for (auto& v : y) v = std::int32_t(rng() % std::uint64_t(classes));
    xs.push_back(tensor::from_host<float>({rows, widths[0]}, x));
    ys.push_back(tensor::from_host<std::int32_t>({rows}, y));
  }
  std::size_t step = 0;
  auto run_for = [&](double s) {
    const auto t0 = clock_type::now();
    std::size_t n = 0;
    while (std::chrono::duration<double>(clock_type::now() - t0).count() < s) {
      net.loss_and_gradients(p.span<float>(), xs[step % 16], ys[step % 16], g.span<float>());
      opt.apply(p.span<float>(), g.span<float>());
      ++step;
      ++n;
    }
    return double(n) / std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  run_for(1.0);
  const double steps_per_s = run_for(seconds);
  // FLOPs of a step: 2 rows in out forward per layer, the same for dW, and for dx except at
  // the first layer.
  double flop = 0;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i)
    flop += (i == 0 ? 4.0 : 6.0) * double(rows) * double(widths[i]) * double(widths[i + 1]);
  std::printf("framework=dtf model=%s batch=%d threads=%d samples_per_s=%.1f gflops=%.2f\n", hidden.c_str(), batch,
              threads, steps_per_s * double(rows), steps_per_s * flop / 1e9);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train_peers_dtf: %s\n", e.what());
  return 1;
}
