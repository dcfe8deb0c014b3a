# dtf::torch — the LibTorch adapter (include/dtf/torch/): an INTERFACE target linking dtf::dtf
# and LibTorch, defined only when find_package(Torch) succeeds and the build is for the CPU
# (Debian's LibTorch has no CUDA). DTF_HAVE_TORCH tells the rest of the build.
include_guard(GLOBAL)
set(DTF_HAVE_TORCH OFF)
if(NOT DTF_CUDA)
  find_package(Torch QUIET)
  if(Torch_FOUND OR TORCH_FOUND)
    add_library(dtf_torch INTERFACE)
    add_library(dtf::torch ALIAS dtf_torch)
    target_link_libraries(dtf_torch INTERFACE dtf::dtf torch)
    set(DTF_HAVE_TORCH ON)
    message(STATUS "dtf: LibTorch found (${Torch_DIR}): dtf::torch defined")
  else()
    message(STATUS "dtf: LibTorch not found: dtf::torch not defined (apt-get install libtorch-dev)")
  endif()
endif()
