# Finds dtf's dependencies and defines dtf::deps, the INTERFACE target that dtf::dtf links.
# Used by dtf's own build and, installed beside dtfConfig.cmake, by every consumer, so both
# see the same settings. Expects DTF_CUDA to be set.
include_guard(GLOBAL)
include(CMakeFindDependencyMacro)

find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto SSL)
find_package(xtl REQUIRED)
find_package(xtensor REQUIRED)
find_package(cereal REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CUDAToolkit QUIET)

# Standalone Asio ships no CMake package: an imported INTERFACE target around its headers.
if(NOT TARGET dtf::asio)
  find_path(DTF_ASIO_INCLUDE_DIR asio.hpp REQUIRED)
  add_library(dtf::asio INTERFACE IMPORTED)
  set_target_properties(dtf::asio PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${DTF_ASIO_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS "ASIO_STANDALONE;ASIO_NO_DEPRECATED")
  target_link_libraries(dtf::asio INTERFACE Threads::Threads)
endif()

# Thrust: the CUDA toolkit's CCCL when there is one, Debian's libthrust-dev otherwise.
if(NOT TARGET dtf::thrust)
  set(_dtf_cccl_hints)
  if(CUDAToolkit_INCLUDE_DIRS)
    foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
      list(APPEND _dtf_cccl_hints ${dir}/cccl ${dir})
    endforeach()
  endif()
  find_path(DTF_THRUST_INCLUDE_DIR thrust/version.h
    HINTS ${_dtf_cccl_hints} PATHS /usr/local/cuda/include/cccl /usr/local/cuda/include /usr/include REQUIRED)
  add_library(dtf::thrust INTERFACE IMPORTED)
  if(NOT DTF_THRUST_INCLUDE_DIR STREQUAL "/usr/include")
    set_target_properties(dtf::thrust PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${DTF_THRUST_INCLUDE_DIR}"
      INTERFACE_INCLUDE_DIRECTORIES "${DTF_THRUST_INCLUDE_DIR}")
  endif()
  if(NOT DTF_CUDA)
    # CPU build: Thrust's device system is OpenMP; without this Thrust assumes CUDA.
    find_package(OpenMP REQUIRED COMPONENTS CXX)
    target_compile_definitions(dtf::thrust INTERFACE THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP)
    target_link_libraries(dtf::thrust INTERFACE OpenMP::OpenMP_CXX)
  endif()
endif()

if(NOT TARGET dtf::deps)
  add_library(dtf::deps INTERFACE IMPORTED)
  target_link_libraries(dtf::deps INTERFACE dtf::asio dtf::thrust xtensor cereal::cereal nlohmann_json::nlohmann_json
    OpenSSL::SSL OpenSSL::Crypto ZLIB::ZLIB Threads::Threads)
  if(DTF_CUDA)
    target_compile_definitions(dtf::deps INTERFACE DTF_CUDA=1)
    target_link_libraries(dtf::deps INTERFACE CUDA::cudart CUDA::cublas CUDA::cublasLt)
    # CMake 3.25 rejects cuda_std_20: pass the standard to nvcc directly.
    target_compile_options(dtf::deps INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr>)
  else()
    set(BLA_VENDOR OpenBLAS)
    find_package(BLAS REQUIRED)
    find_path(DTF_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas REQUIRED)
    target_include_directories(dtf::deps INTERFACE ${DTF_CBLAS_INCLUDE_DIR})
    target_link_libraries(dtf::deps INTERFACE BLAS::BLAS)
  endif()
endif()

# Optional collective backends. Neither is ever required: each defines its target only where
# its library is found, and dtf::dtf never links them. A program that uses
# dtf/collectives/backends/mpi.hpp links dtf::mpi; one that uses backends/nccl.hpp links
# dtf::nccl (CUDA builds only).
if(NOT DEFINED DTF_WITH_MPI OR DTF_WITH_MPI)
  find_package(MPI QUIET COMPONENTS CXX)
endif()
if(MPI_CXX_FOUND AND NOT TARGET dtf::mpi)
  add_library(dtf::mpi INTERFACE IMPORTED)
  target_compile_definitions(dtf::mpi INTERFACE DTF_HAVE_MPI=1)
  target_link_libraries(dtf::mpi INTERFACE MPI::MPI_CXX)
endif()
if(DTF_CUDA AND NOT TARGET dtf::nccl)
  set(_dtf_nccl_hints)
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND _dtf_nccl_hints ${dir})
  endforeach()
  find_path(DTF_NCCL_INCLUDE_DIR nccl.h HINTS ${_dtf_nccl_hints} PATHS /usr/local/cuda/include /usr/include)
  find_library(DTF_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS /usr/local/cuda/lib64)
  if(DTF_NCCL_INCLUDE_DIR AND DTF_NCCL_LIBRARY)
    add_library(dtf::nccl INTERFACE IMPORTED)
    set_target_properties(dtf::nccl PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${DTF_NCCL_INCLUDE_DIR}")
    target_compile_definitions(dtf::nccl INTERFACE DTF_HAVE_NCCL=1)
    target_link_libraries(dtf::nccl INTERFACE "${DTF_NCCL_LIBRARY}" CUDA::cudart)
  endif()
endif()
