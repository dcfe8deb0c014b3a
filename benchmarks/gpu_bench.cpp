// bench_gpu — dtf on one NVIDIA GPU, each figure beside its reference measured in the same run
// (CUDA builds only; scripts/gpu-check.sh runs it):
//
//   1. step     the MLP (784-256-128-10 and 784-2048-2048-10, batch 64/256/1024, Adam, one
//               resident Fashion-MNIST batch): median ms per training step (forward, backward,
//               update). benchmarks/gpu_step_time_torch.py times the same step in PyTorch.
//   2. gemm     nn::dense's forward at those layers' shapes against cublasSgemm called here on
//               a handle of this program's own, after checking both give the same product.
//   3. staging  a ps on a background thread, one client, one variable of N floats in device
//               memory: pull and push_gradients through dtf's pinned staging buffer against the
//               plain way (the same calls on a pageable host vector plus a cudaMemcpy each way).
//
// Every line of figures is also printed as CSV ("csv,<section>,...") for the summary.
//
//   build-gpu/benchmarks/bench_gpu [--data DIR] [--repeats 5] [--steps 50] [--max_mib 256]
#include <dtf/dtf.hpp>

#include "mlp_widths.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#if !DTF_CUDA
#error "bench_gpu measures the CUDA build: configure with -DDTF_CUDA=ON"
#endif

namespace {
using clock_type = std::chrono::steady_clock;
using dtf::errc;
using dtf::error;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw error(errc::internal, std::string(what) + ": " + cudaGetErrorString(e));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds per call of f over `repeats` runs of `inner` calls, the device drained before
// and after each run (kernels are asynchronous: a host clock alone times their launch).
double time_per_call(const std::function<void()>& f, int repeats, int inner) {
  for (int i = 0; i < 3; ++i) f();  // warm-up: cuBLAS heuristics, allocations
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> runs;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clock_type::now();
    for (int i = 0; i < inner; ++i) f();
    check(cudaDeviceSynchronize(), "timed run");
    runs.push_back(std::chrono::duration<double>(clock_type::now() - t0).count() / inner);
  }
  return median(runs);
}

void section_step(const std::string& data_dir, int repeats, int steps) {
  using namespace dtf;
  std::printf("== 1. training step: MLP, Adam, one resident batch (median ms/step over %d runs of %d) ==\n",
              repeats, steps);
  std::printf("%-18s %6s %10s %12s\n", "widths", "batch", "ms/step", "samples/s");
  const auto train = data::load_fashion_mnist(data::split::train, data_dir).normalize();
  for (const std::string hidden : {"256,128", "2048,2048"}) {
    for (std::size_t batch : {64, 256, 1024}) {
      auto net = bench::mlp(bench::layer_widths(784, hidden, 10));
      tensor p({net.num_parameters()}), g({net.num_parameters()}), x, y;
      net.initialize(p.span<float>(), 1);
      optim::optimizer<> opt(optim::adam{}, net.num_parameters());
      auto s = train.batch(batch, true).stream();
      auto b = s.next();
      assign_from_host(x, b->features);
      assign_from_host(y, b->labels);
      float loss = 0;
      const double t = time_per_call(
          [&] {
            loss = net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
            opt.apply(p.span<float>(), g.span<float>());
          },
          repeats, steps);
      if (!std::isfinite(loss)) throw error(errc::internal, "non-finite loss in the step benchmark");
      std::string widths = "784-" + hidden + "-10";
      std::replace(widths.begin(), widths.end(), ',', '-');
      std::printf("%-18s %6zu %10.4f %12.0f\n", widths.c_str(), batch, 1e3 * t, double(batch) / t);
      std::printf("csv,step,dtf,%s,%zu,%.5f\n", widths.c_str(), batch, 1e3 * t);
    }
  }
}

void section_gemm(int repeats) {
  using namespace dtf;
  std::printf("\n== 2. GEMM: nn::dense forward (x W + b) against cublasSgemm (x W) on this program's handle ==\n");
  std::printf("%6s %6s %6s %12s %12s %8s\n", "batch", "in", "out", "dense GF/s", "cuBLAS GF/s", "ratio");
  cublasHandle_t h{};
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw error(errc::internal, "cublasCreate failed");
  std::unique_ptr<cublasContext, decltype(&cublasDestroy)> guard(h, &cublasDestroy);
  for (std::size_t rows : {64, 256, 1024}) {
    for (auto [in, out] : {std::pair<std::size_t, std::size_t>{784, 256}, {256, 128}, {128, 10}, {784, 2048},
                           {2048, 2048}, {2048, 10}}) {
      nn::dense layer(in, out);
      tensor p({layer.num_parameters()}), x({rows, in}), y, yref({rows, out});
      std::vector<float> xv(rows * in);
      nn::splitmix64 rng(3);
      for (auto& v : xv) v = float(rng.uniform());
      x.copy_from_host<float>(xv);
      layer.initialize(p.span<float>(), 1, true);  // biases start at zero: x W + b == x W
      const float one = 1.0f, zero = 0.0f;
      // Row-major C[rows,out] = X[rows,in] W[in,out] is column-major C^T = W^T X^T.
      auto sgemm = [&] {
        if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, int(out), int(rows), int(in), &one, p.data<float>(), int(out),
                        x.data<float>(), int(in), &zero, yref.data<float>(), int(out)) != CUBLAS_STATUS_SUCCESS)
          throw error(errc::internal, "cublasSgemm failed");
      };
      const int inner = 100;
      const double dense_s = time_per_call([&] { layer.forward(p.data<float>(), x, y); }, repeats, inner);
      const double blas_s = time_per_call(sgemm, repeats, inner);
      const auto a = y.to_vector<float>(), b = yref.to_vector<float>();
      for (std::size_t i = 0; i < a.size(); ++i)
        if (std::abs(a[i] - b[i]) > 1e-3f * (1 + std::abs(b[i])))
          throw error(errc::internal, "nn::dense and cublasSgemm differ at element " + std::to_string(i));
      const double flop = 2.0 * double(rows * in * out);
      std::printf("%6zu %6zu %6zu %12.1f %12.1f %8.2f\n", rows, in, out, flop / dense_s / 1e9, flop / blas_s / 1e9,
                  blas_s / dense_s);
      std::printf("csv,gemm,%zu,%zu,%zu,%.3f,%.3f\n", rows, in, out, flop / dense_s / 1e9, flop / blas_s / 1e9);
    }
  }
  std::printf("(ratio = cuBLAS time / nn::dense time: 1.00 means the layer adds nothing to the GEMM)\n");
}

dtf::transport_options quiet(std::string identity) {
  dtf::transport_options o;
  o.cluster_id = "bench-gpu";
  o.identity = std::move(identity);
  o.timeout_ms = 120000;
  o.log = [](const std::string&) {};
  return o;
}

void section_staging(int repeats, std::size_t max_mib) {
  using namespace dtf;
  std::printf("\n== 3. ps traffic from device memory: pinned staging against a pageable copy (GB/s, median of %d) ==\n",
              repeats);
  std::printf("%8s %12s %12s %8s %12s %12s %8s\n", "MiB", "pull staged", "pull plain", "ratio", "push staged",
              "push plain", "ratio");
  for (std::size_t mib = 4; mib <= max_mib; mib *= 4) {
    const std::size_t n = (mib << 20) / sizeof(float);
    parameter_server server("127.0.0.1:0", ps_options{quiet("ps.0"), 1});
    std::thread serving([&] { server.run(); });
    struct stopper {
      parameter_server& s;
      std::thread& t;
      ~stopper() {
        s.stop();
        t.join();
      }
    } stop{server, serving};
    const auto layout = partitioners::round_robin{}.place({{"v", {n}, 0}}, 1);
    ps_client c({"127.0.0.1:" + std::to_string(server.port())}, layout, quiet("worker.0"));
    c.connect();
    std::vector<float> init(n, 1.0f), host(n);
    c.initialize(init, {optim::sgd{0.0f}});  // rate 0: pushes leave the values as they are
    tensor dev({n});
    const std::size_t bytes = n * sizeof(float);
    const double pull_staged = time_per_call([&] { c.pull(device_span<float>{dev.span<float>()}); }, repeats, 1);
    const double pull_plain = time_per_call(
        [&] {
          c.pull(host);
          check(cudaMemcpy(dev.data<float>(), host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
        },
        repeats, 1);
    const double push_staged =
        time_per_call([&] { c.push_gradients(device_span<const float>{dev.span<float>()}); }, repeats, 1);
    const double push_plain = time_per_call(
        [&] {
          check(cudaMemcpy(host.data(), dev.data<float>(), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
          c.push_gradients(host);
        },
        repeats, 1);
    const auto back = dev.to_vector<float>();
    if (std::any_of(back.begin(), back.end(), [](float v) { return v != 1.0f; }))
      throw error(errc::internal, "the staged pull did not bring the ps's values");
    const double gb = double(bytes) / 1e9;
    std::printf("%8zu %12.2f %12.2f %8.2f %12.2f %12.2f %8.2f\n", mib, gb / pull_staged, gb / pull_plain,
                pull_plain / pull_staged, gb / push_staged, gb / push_plain, push_plain / push_staged);
    std::printf("csv,staging,%zu,%.3f,%.3f,%.3f,%.3f\n", mib, gb / pull_staged, gb / pull_plain, gb / push_staged,
                gb / push_plain);
  }
  std::printf("(ratio = plain time / staged time: above 1.00 means staging is faster)\n");
}
}  // namespace

int main(int argc, char** argv) try {
  int repeats = 5, steps = 50, max_mib = 256;
  std::string data_dir = dtf::data::fashion_mnist_default_dir, sections = "step,gemm,staging";
  dtf::flag_parser flags("dtf on one GPU beside PyTorch's step (run separately), cuBLAS and a pageable copy.");
  flags.add("repeats", repeats, "timed runs per figure (the median is reported)")
      .add("steps", steps, "training steps per timed run")
      .add("max_mib", max_mib, "largest ps variable in MiB (4, 16, 64, ... up to this)")
      .add("sections", sections, "comma-separated: step, gemm, staging")
      .add("data", data_dir, "Fashion-MNIST directory");
  if (!flags.parse(argc, argv)) return 0;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (compute capability %d.%d)\n", prop.name, prop.major, prop.minor);
  auto want = [&](const char* s) { return ("," + sections + ",").find("," + std::string(s) + ",") != std::string::npos; };
  if (want("step")) section_step(data_dir, repeats, steps);
  if (want("gemm")) section_gemm(repeats);
  if (want("staging")) section_staging(repeats, std::size_t(max_mib));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gpu: %s\n", e.what());
  return 1;
}
