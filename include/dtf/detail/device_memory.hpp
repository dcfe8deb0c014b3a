// dtf/detail/device_memory.hpp — refuses ordinary host memory where a CUDA build wants device
// memory (a model's parameters and gradients): a kernel reading a std::vector's bytes faults,
// and the fault poisons the process's CUDA context, so every later call fails too.
#pragma once

#include <dtf/config.hpp>
#include <dtf/error.hpp>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

#include <array>
#include <cstddef>
#include <string>

namespace dtf::detail {

/// CUDA builds: throws errc::invalid_argument naming `who` and `what` ("nn::sequential",
/// "parameter") when p is ordinary (unregistered)
/// host memory. Device, managed and pinned host memory pass (kernels may read all three); so
/// does a pointer the runtime cannot classify (the kernel then reports it). The last few
/// pointers that passed on this thread are remembered, so a training loop queries once.
/// CPU builds: nothing (device memory is host memory).
inline void require_device_memory(const void* p, const char* who, const char* what) {
#if DTF_CUDA
  thread_local std::array<const void*, 4> passed{};
  thread_local std::size_t next = 0;
  if (p == nullptr) return;
  for (const void* q : passed)
    if (q == p) return;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // the failed query leaves its error for the next cudaGetLastError
    return;
  }
  if (a.type == cudaMemoryTypeUnregistered)
    throw error(errc::invalid_argument,
                std::string(who) + ": the " + what +
                    " buffer is host memory (a std::vector's?), but this is a CUDA build: pass device memory, e.g. a "
                    "dtf::tensor's span (tensor::from_host copies host values into one)");
  passed[next] = p;
  next = (next + 1) % passed.size();
#else
  (void)p;
  (void)who;
  (void)what;
#endif
}

}  // namespace dtf::detail
