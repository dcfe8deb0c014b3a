// dtf/runtime.hpp — process-wide CPU threading settings, applied once at the start of main().
//
// On CPU builds two thread pools compete for the cores: Thrust's OpenMP device system (the
// element-wise kernels) and OpenBLAS (GEMM). Element-wise kernels on training-sized tensors
// gain nothing from more threads, and OpenMP threads that spin-wait between them steal the
// cores from BLAS: measured here (2 cores), a 784-256-128-10 MLP trains at about 8k samples/s
// with both pools at their defaults and about 50k with one device thread.
// When several dtf processes share a machine, give each one BLAS thread.
#pragma once

#include <dtf/config.hpp>
#include <dtf/detail/blas.hpp>

#if !DTF_CUDA && defined(_OPENMP)
#include <omp.h>
#endif

namespace dtf {

/// Process-wide CPU threading settings (CPU builds): Thrust's OpenMP device threads and OpenBLAS
/// threads, applied once at the start of main().
struct cpu_threads {
  int device = 1;  ///< OpenMP threads for Thrust's device system (CPU builds); 0 leaves the default
  int blas = 0;    ///< OpenBLAS threads (CPU builds); 0 leaves the library's default (all cores)
};

/// Applies the settings for the calling thread and the BLAS library. No effect on CUDA builds.
inline void set_cpu_threads(cpu_threads t) {
#if !DTF_CUDA && defined(_OPENMP)
  if (t.device > 0) omp_set_num_threads(t.device);
#endif
  if (t.blas > 0) detail::set_blas_threads(t.blas);
}

}  // namespace dtf
