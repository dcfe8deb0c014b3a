// dtf's MPI backend (dtf::mpi_communicator: dtf's descriptor check, then MPI_Iallreduce),
// float32 sum, over the sweep of allreduce_common.hpp. Its distance from bench_allreduce_mpi
// (MPI_Allreduce called directly) is the cost of dtf's layer: one MPI_Iallgather of the
// 96-byte descriptors per collective and polling with MPI_Test.
//   mpirun -np 2 --mca btl tcp,self build/benchmarks/bench_allreduce_dtf_mpi
#include <dtf/collectives.hpp>
#include <dtf/collectives/backends/mpi.hpp>

#include <mpi.h>

#include "allreduce_common.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  try {
    dtf::mpi_communicator comm(dtf::mpi_backend(MPI_COMM_WORLD));
    bench::sweep("dtf_mpi", int(comm.rank()), int(comm.size()), [&] { MPI_Barrier(MPI_COMM_WORLD); },
                 [&](std::vector<float>& v) { comm.allreduce<float>("bench", v); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce_dtf_mpi: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return 0;
}
