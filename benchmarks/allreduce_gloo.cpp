// Gloo (Debian's libgloo-dev) allreduce over TCP, float32 sum, over the sweep of
// allreduce_common.hpp. Ranks come from mpirun's variables; they meet through a
// gloo::rendezvous::FileStore in the directory given by --store.
//   mpirun -np 2 build/benchmarks/bench_allreduce_gloo --store /tmp/gloo --algorithm ring_chunked
// Algorithms: ring_chunked (gloo::AllreduceRingChunked: reduce-scatter + allgather, the one
// Horovod and PyTorch used over TCP), ring (gloo::allreduce with Algorithm::RING, Gloo's
// newer API), bcube (gloo::allreduce with Algorithm::BCUBE).
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "allreduce_common.hpp"

#include <memory>
#include <string>

int main(int argc, char** argv) try {
  std::string store_dir, algorithm = "ring_chunked", prefix = "bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--store") store_dir = argv[i + 1];
    else if (flag == "--algorithm") algorithm = argv[i + 1];
    else if (flag == "--prefix") prefix = argv[i + 1];
    else throw std::runtime_error("unknown flag " + flag);
  }
  int rank = 0, size = 1;
  if (!bench::launcher_rank(rank, size)) throw std::runtime_error("run under mpirun (no OMPI_COMM_WORLD_RANK)");
  if (store_dir.empty()) throw std::runtime_error("--store DIR is required");
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore file_store(store_dir);
  gloo::rendezvous::PrefixStore store(prefix, file_store);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(std::chrono::seconds(60));
  context->connectFullMesh(store, device);
  gloo::BarrierAllToOne barrier(context);
  const std::string impl = "gloo_" + algorithm;
  if (algorithm == "ring_chunked") {
    // As in Gloo's own benchmark: the algorithm is built once per buffer (it allocates and
    // registers its buffers with the pairs) and run many times; the first, untimed warm-up
    // iteration of each size builds it.
    std::unique_ptr<gloo::AllreduceRingChunked<float>> op;
    std::pair<float*, std::size_t> built_for{nullptr, 0};
    bench::sweep(impl.c_str(), rank, size, [&] { barrier.run(); }, [&](std::vector<float>& v) {
      if (built_for != std::pair{v.data(), v.size()}) {
        op.reset();
        op = std::make_unique<gloo::AllreduceRingChunked<float>>(context, std::vector<float*>{v.data()}, int(v.size()));
        built_for = {v.data(), v.size()};
      }
      op->run();
    });
  } else if (algorithm == "ring" || algorithm == "bcube") {
    const auto algo = algorithm == "ring" ? gloo::AllreduceOptions::Algorithm::RING : gloo::AllreduceOptions::Algorithm::BCUBE;
    bench::sweep(impl.c_str(), rank, size, [&] { barrier.run(); }, [&](std::vector<float>& v) {
      gloo::AllreduceOptions opts(context);
      opts.setAlgorithm(algo);
      opts.setOutput(v.data(), v.size());
      opts.setReduceFunction([](void* c, const void* a, const void* b, size_t n) {
        auto* out = static_cast<float*>(c);
        const auto* x = static_cast<const float*>(a);
        const auto* y = static_cast<const float*>(b);
        for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
      });
      gloo::allreduce(opts);
    });
  } else {
    throw std::runtime_error("unknown --algorithm " + algorithm);
  }
  barrier.run();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_allreduce_gloo: %s\n", e.what());
  return 2;
}
