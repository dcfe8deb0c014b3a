// dtf's ring allreduce, float32 sum, over the sweep of allreduce_common.hpp.
//   mpirun -np 2 build/benchmarks/bench_allreduce_dtf --rendezvous 127.0.0.1:29600
//   dtfrun --workers 2 -- build/benchmarks/bench_allreduce_dtf
// benchmarks/allreduce.sh runs it beside Gloo and OpenMPI and prints the table.
#include <dtf/cluster.hpp>
#include <dtf/collectives.hpp>

#include "allreduce_common.hpp"

int main(int argc, char** argv) try {
  dtf::cluster_flags cf;
  cf.num_ps = 0;
  int segment_kib = 256, small_kib = 64, hypercube_small_kib = 256, spin_us = 20, sockbuf_kib = 0;
  bool hypercube = true;
  dtf::flag_parser flags("Benchmarks dtf's allreduce (float32 sum) from 4 KiB to 64 MiB.");
  dtf::add_cluster_flags(flags, cf);
  flags.add("segment_kib", segment_kib, "allreduce segment size in KiB")
      .add("small_kib", small_kib, "largest allreduce on the low-latency path, KiB")
      .add("hypercube_small_kib", hypercube_small_kib, "largest allreduce by recursive doubling (power-of-two worlds), KiB")
      .add("spin_us", spin_us, "spin before blocking, microseconds")
      .add("sockbuf_kib", sockbuf_kib, "socket buffer size in KiB (0: kernel autotuning)")
      .add("hypercube", hypercube, "power-of-two worlds: recursive doubling/halving; --nohypercube: the ring");
  if (!flags.parse(argc, argv)) return 0;
  dtf::cluster c = dtf::resolve_cluster(cf);
  dtf::collective_options o;
  o.cluster_id = c.id();
  o.segment_bytes = std::size_t(segment_kib) * 1024;
  o.small_bytes = std::size_t(small_kib) * 1024;
  o.hypercube_small_bytes = std::size_t(hypercube_small_kib) * 1024;
  o.spin_us = std::uint32_t(spin_us);
  o.socket_buffer_bytes = sockbuf_kib * 1024;
  o.hypercube = hypercube;
  dtf::communicator comm = dtf::make_communicator(c, o);
  bench::sweep("dtf", int(comm.rank()), int(comm.size()), [&] { comm.barrier(); },
               [&](std::vector<float>& v) { comm.allreduce<float>("bench", v); });
  comm.barrier();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_allreduce_dtf: %s\n", e.what());
  return 2;
}
