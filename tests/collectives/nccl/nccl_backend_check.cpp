// dtf's NCCL backend on the GPUs of one machine: one rank per visible GPU (2 to 4), ranks as
// threads of this process, bootstrapped over dtf's TCP ring on loopback. Allreduce (every op,
// float32 and int32), broadcast and allgather of device tensors are compared with exact
// references; a mismatched tensor name must fail every rank naming the other rank.
// Exit status: 0 pass, 1 fail, 77 skipped (fewer than 2 GPUs: NCCL refuses two ranks on one
// GPU). Built in CUDA builds where NCCL is found. NOT YET RUN: no GPU was available while it
// was written; it has only been compiled.
#include <dtf/collectives.hpp>
#include <dtf/collectives/backends/nccl.hpp>
#include <dtf/tensor.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace {

float value(std::size_t rank, std::size_t i) { return float(int((i * 7 + rank * 13) % 1001) - 500); }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void rank_body(dtf::nccl_communicator& comm) {
  const std::size_t n = comm.size(), r = comm.rank();
  for (const std::size_t count : {std::size_t(1), std::size_t(1000), std::size_t(1 << 20) + 3}) {
    for (const auto op : {dtf::reduce_op::sum, dtf::reduce_op::average, dtf::reduce_op::min, dtf::reduce_op::max}) {
      std::vector<float> mine(count);
      for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
      auto t = dtf::tensor::from_host<float>({count}, mine);
      comm.allreduce("f" + std::to_string(count), t, op);
      const auto got = t.to_vector<float>();
      for (std::size_t i = 0; i < count; ++i) {
        float want = value(0, i);
        for (std::size_t k = 1; k < n; ++k) {
          const float v = value(k, i);
          want = op == dtf::reduce_op::min ? std::min(want, v) : op == dtf::reduce_op::max ? std::max(want, v) : want + v;
        }
        if (op == dtf::reduce_op::average) want = want / float(n);
        require(got[i] == want, "allreduce " + std::string(dtf::name_of(op)) + " element " + std::to_string(i));
      }
    }
    std::vector<std::int32_t> ints(count);
    for (std::size_t i = 0; i < count; ++i) ints[i] = std::int32_t(value(r, i));
    auto ti = dtf::tensor::from_host<std::int32_t>({count}, ints);
    comm.allreduce("i" + std::to_string(count), ti, dtf::reduce_op::average);
    const auto got = ti.to_vector<std::int32_t>();
    for (std::size_t i = 0; i < count; ++i) {
      std::int32_t sum = 0;
      for (std::size_t k = 0; k < n; ++k) sum += std::int32_t(value(k, i));
      require(got[i] == std::int32_t(sum / std::int32_t(n)), "integer average element " + std::to_string(i));
    }
  }
  std::vector<float> mine(4099);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = value(r, i);
  auto b = dtf::tensor::from_host<float>({mine.size()}, mine);
  comm.broadcast("b", b, n - 1);
  const auto got = b.to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i) require(got[i] == value(n - 1, i), "broadcast element");
  try {
    auto t = dtf::tensor::from_host<float>({mine.size()}, mine);
    comm.allreduce(r == n - 1 ? "gradz" : "grads", t);
    require(false, "a mismatched allreduce completed");
  } catch (const dtf::error& e) {
    require(e.message().find("mismatched collective") != std::string::npos, e.message());
  }
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::printf("SKIP: %d CUDA device(s); the NCCL backend check needs 2 (one rank per GPU)\n", devices);
    return 77;
  }
  const std::size_t n = std::size_t(std::min(devices, 4));
  std::vector<dtf::ring_listener> listeners;
  std::vector<std::string> addresses;
  for (std::size_t i = 0; i < n; ++i) {
    listeners.emplace_back("127.0.0.1:0");
    addresses.push_back("127.0.0.1:" + std::to_string(listeners.back().port()));
  }
  std::vector<std::string> failures(n);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        cudaSetDevice(int(r));
        dtf::tcp_backend ring(std::move(listeners[r]), r, addresses, {}, {.timeout_ms = 60000});
        dtf::nccl_communicator comm(dtf::nccl_backend(std::move(ring)));
        rank_body(comm);
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  int rc = 0;
  for (std::size_t r = 0; r < n; ++r)
    if (!failures[r].empty()) {
      std::printf("FAIL rank %zu: %s\n", r, failures[r].c_str());
      rc = 1;
    }
  if (rc == 0) std::printf("PASS: %zu ranks on %zu GPUs\n", n, n);
  return rc;
}

// Every member of the communicator over NCCL compiles.
template class dtf::basic_communicator<dtf::nccl_backend>;
