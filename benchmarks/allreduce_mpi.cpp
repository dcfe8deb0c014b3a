// OpenMPI's MPI_Allreduce (float32 sum) over the sweep of allreduce_common.hpp.
//   mpirun -np 2 --mca btl tcp,self build/benchmarks/bench_allreduce_mpi
#include <mpi.h>

#include "allreduce_common.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bench::sweep("openmpi", rank, size, [] { MPI_Barrier(MPI_COMM_WORLD); }, [](std::vector<float>& v) {
    MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  MPI_Finalize();
  return 0;
}
