// dtf/config.hpp — build configuration seen by every dtf header.
//
// DTF_CUDA is set (to 1) on the dtf::dtf target when the library was configured with
// -DDTF_CUDA=ON; the build then compiles translation units with nvcc, device memory lives
// on the GPU and GEMM goes through cuBLAS. Otherwise Thrust's device system is OpenMP (or
// the sequential CPP system) on the host, and GEMM goes through CBLAS (OpenBLAS).
#pragma once

/// dtf's version: major, minor and patch.
///@{
#define DTF_VERSION_MAJOR 0
#define DTF_VERSION_MINOR 1
#define DTF_VERSION_PATCH 0
///@}

#if !defined(DTF_CUDA)
/// 1 in a CUDA build (set on the dtf::dtf target when configured with -DDTF_CUDA=ON), 0 otherwise.
#define DTF_CUDA 0
#endif

#if DTF_CUDA && !defined(__CUDACC__)
#error "dtf was configured with DTF_CUDA=ON: compile this translation unit with nvcc (set its LANGUAGE to CUDA)"
#endif

#if defined(__CUDACC__)
// Functions usable from host code and from device kernels.
#define DTF_HD __host__ __device__
#else
/// Marks functions usable from host code and from device kernels: `__host__ __device__` under
/// nvcc, empty otherwise.
#define DTF_HD
#endif

#if !DTF_CUDA && !defined(THRUST_DEVICE_SYSTEM)
// A CPU build without an explicit choice: the OpenMP system when OpenMP is on, the
// sequential C++ system otherwise. Without this, Thrust assumes CUDA and g++ fails.
#if defined(_OPENMP)
#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_OMP
#else
#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP
#endif
#endif

namespace dtf {

/// True when "device" memory is ordinary host memory (CPU builds): a tensor's bytes can then
/// be read and written by the host and sent by the transport without staging.
inline constexpr bool device_memory_is_host_accessible = !DTF_CUDA;

}  // namespace dtf
