// Shared by the three allreduce benchmark programs (dtf, Gloo, OpenMPI): the size sweep, the
// iteration counts, result verification and the CSV line, so that the three measure exactly
// the same thing. Plain C++: no dtf, Gloo or MPI headers.
//
// Per size: every rank fills its buffer (rank r, element i: (i % 17) + r, exact in float32),
// runs `warmup` untimed iterations, then `iters` timed ones, each preceded by a barrier and a
// refill (both untimed); rank 0 reports the median of its per-iteration times, algbw =
// bytes / time and busbw = algbw * 2(n-1)/n. The result of the first and last iterations is
// verified on every rank; a wrong element aborts the run (exit status 3) before any figure.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace bench {

inline std::vector<std::size_t> sizes_from_env() {
  std::size_t lo = 4096, hi = std::size_t(64) << 20;
  if (const char* s = std::getenv("ALLREDUCE_MIN_BYTES")) lo = std::strtoull(s, nullptr, 10);
  if (const char* s = std::getenv("ALLREDUCE_MAX_BYTES")) hi = std::strtoull(s, nullptr, 10);
  std::vector<std::size_t> out;
  for (std::size_t b = lo; b <= hi; b *= 4) out.push_back(b);
  return out;
}

/// Timed iterations for a size: about 64 MiB moved per size, at least 10 and at most 1000.
inline int iterations_for(std::size_t bytes) {
  double scale = 1.0;
  if (const char* s = std::getenv("ALLREDUCE_ITER_SCALE")) scale = std::atof(s);
  const std::size_t target = std::size_t(double(std::size_t(256) << 20) * scale);
  return int(std::clamp<std::size_t>(target / bytes, 10, 1000));
}

inline void fill(std::vector<float>& v, int rank) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 17) + float(rank);
}

/// Checks the sum over n ranks; exits with status 3 on the first wrong element.
inline void verify(const std::vector<float>& v, int n, const char* impl, int rank) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float expected = float(n) * float(i % 17) + float(n * (n - 1) / 2);
    if (v[i] != expected) {
      std::fprintf(stderr, "%s rank %d: WRONG RESULT at element %zu of %zu: %g, expected %g\n", impl, rank, i, v.size(),
                   double(v[i]), double(expected));
      std::exit(3);
    }
  }
}

/// Runs the sweep. barrier() and allreduce(std::vector<float>&) are the implementation's.
template <class Barrier, class Allreduce>
void sweep(const char* impl, int rank, int n, Barrier barrier, Allreduce allreduce) {
  using clock = std::chrono::steady_clock;
  if (rank == 0) std::printf("impl,ranks,bytes,iters,median_us,algbw_GBps,busbw_GBps\n");
  for (const std::size_t bytes : sizes_from_env()) {
    std::vector<float> buf(bytes / sizeof(float));
    const int iters = iterations_for(bytes), warmup = std::max(2, iters / 10);
    std::vector<double> times;
    for (int it = 0; it < warmup + iters; ++it) {
      fill(buf, rank);
      barrier();
      const auto t0 = clock::now();
      allreduce(buf);
      const auto t1 = clock::now();
      if (it == 0 || it + 1 == warmup + iters) verify(buf, n, impl, rank);
      if (it >= warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    const double median = times[times.size() / 2];
    const double algbw = double(bytes) / median / 1e9;
    if (rank == 0) {
      std::printf("%s,%d,%zu,%d,%.2f,%.4f,%.4f\n", impl, n, bytes, iters, median * 1e6, algbw,
                  algbw * 2.0 * (n - 1) / n);
      std::fflush(stdout);
    }
  }
}

/// Rank and size from the launcher's variables (mpirun: OMPI_COMM_WORLD_*, else PMI_*).
inline bool launcher_rank(int& rank, int& size) {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!r) r = std::getenv("PMI_RANK"), s = std::getenv("PMI_SIZE");
  if (!r || !s) return false;
  rank = std::atoi(r);
  size = std::atoi(s);
  return true;
}

}  // namespace bench
