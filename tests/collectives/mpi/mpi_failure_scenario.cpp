// A rank that fails while the others are inside an allreduce on dtf's MPI backend; run by
// test_mpi_backend_failures.sh under mpirun.
//   mpi_failure_scenario stalled <timeout_ms>: the last rank stays alive but never calls the
//     collective; every other rank must fail with errc::timeout within timeout_ms (plus a
//     margin), print "TIMEOUT <rank> <elapsed_ms> <message>", and end the job with MPI_Abort.
//   mpi_failure_scenario dead: the last rank exits without MPI_Finalize before the collective;
//     OpenMPI's mpirun must end every other rank (none prints "COMPLETED").
#include <dtf/collectives.hpp>
#include <dtf/collectives/backends/mpi.hpp>

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpi_failure_scenario stalled <timeout_ms> | dead\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const std::string mode = argv[1];
  const std::uint32_t timeout_ms = argc > 2 ? std::uint32_t(std::stoul(argv[2])) : 30000;
  dtf::mpi_communicator comm(dtf::mpi_backend(MPI_COMM_WORLD, {.timeout_ms = timeout_ms}));
  const std::size_t last = comm.size() - 1;
  std::vector<float> grads(1 << 16, float(comm.rank()));
  comm.allreduce("warm-up", std::span<float>(grads));  // every rank is up and connected
  if (comm.rank() == last) {
    if (mode == "dead") std::_Exit(3);
    // Stalled: alive, holding no collective; mpirun ends this process when a peer aborts.
    for (;;) pause();
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    comm.allreduce("grads", std::span<float>(grads));
    std::printf("COMPLETED %zu\n", comm.rank());
    std::fflush(stdout);
  } catch (const dtf::error& e) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    const bool timed_out = e.code() == dtf::make_error_code(dtf::errc::timeout);
    std::printf("%s %zu %lld %s\n", timed_out ? "TIMEOUT" : "ERROR", comm.rank(), static_cast<long long>(ms),
                e.message().c_str());
    std::fflush(stdout);
    comm.backend().abort_job(4);
  }
  MPI_Finalize();
  return 0;
}
