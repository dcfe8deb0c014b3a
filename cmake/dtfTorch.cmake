# dtf::torch — the LibTorch adapter (include/dtf/torch/): an INTERFACE target linking dtf::dtf
# and LibTorch, defined when find_package(Torch) succeeds: on CPU builds any LibTorch, on CUDA
# builds (DTF_CUDA) only a LibTorch with CUDA (PyTorch's: -DCMAKE_PREFIX_PATH=$(python3 -c
# 'import torch.utils; print(torch.utils.cmake_prefix_path)')), since the adapter's tensors over
# dtf's memory are then on the GPU; with a CPU-only LibTorch (Debian's) a CUDA build has no
# dtf::torch and a status message says why. DTF_HAVE_TORCH tells the rest of the build.
#
# Included by dtf's own CMakeLists.txt (the build tree, add_subdirectory too) and by the
# installed package's dtfConfig.cmake for find_package(dtf COMPONENTS torch). LibTorch's
# imported targets (torch, c10, ...) are made global when this file's find_package(Torch)
# creates them: an imported target is otherwise visible only in the directory that found it,
# and a project that adds dtf with add_subdirectory could not link dtf::torch without calling
# find_package(Torch) itself first.
include_guard(GLOBAL)
set(DTF_HAVE_TORCH OFF)
get_property(_dtf_imported_before DIRECTORY PROPERTY IMPORTED_TARGETS)
find_package(Torch QUIET)
if(Torch_FOUND OR TORCH_FOUND)
  get_property(_dtf_imported_after DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_dtf_target IN LISTS _dtf_imported_after)
    if(NOT _dtf_target IN_LIST _dtf_imported_before)
      get_target_property(_dtf_global ${_dtf_target} IMPORTED_GLOBAL)
      if(NOT _dtf_global)
        set_target_properties(${_dtf_target} PROPERTIES IMPORTED_GLOBAL TRUE)
      endif()
    endif()
  endforeach()
  # A LibTorch with CUDA: TorchConfig.cmake adds TORCH_CUDA_LIBRARIES (c10_cuda among them) to
  # TORCH_LIBRARIES, and Caffe2's targets include torch_cuda and c10_cuda; a CPU-only one has none.
  set(_dtf_torch_cuda OFF)
  if(TARGET torch_cuda OR TARGET c10_cuda OR TORCH_CUDA_LIBRARIES)
    set(_dtf_torch_cuda ON)
  endif()
  if(DTF_CUDA AND NOT _dtf_torch_cuda)
    message(STATUS "dtf: LibTorch found (${Torch_DIR}) without CUDA: dtf::torch not defined in this CUDA build "
                   "(the adapter's tensors are on the GPU; point CMAKE_PREFIX_PATH at a LibTorch with CUDA, "
                   "e.g. PyTorch's torch.utils.cmake_prefix_path)")
  else()
    if(TARGET dtf::torch)
      # defined already (the package found twice)
    elseif(DTF_TORCH_IMPORTED)  # the installed package (dtfConfig.cmake): dtf::dtf is imported
      add_library(dtf::torch INTERFACE IMPORTED GLOBAL)
      set_target_properties(dtf::torch PROPERTIES INTERFACE_LINK_LIBRARIES "dtf::dtf;torch")
    else()  # dtf's own build tree, top level or added with add_subdirectory
      add_library(dtf_torch INTERFACE)
      add_library(dtf::torch ALIAS dtf_torch)
      target_link_libraries(dtf_torch INTERFACE dtf::dtf torch)
    endif()
    set(DTF_HAVE_TORCH ON)
    if(DTF_CUDA)
      message(STATUS "dtf: LibTorch with CUDA found (${Torch_DIR}): dtf::torch defined (CUDA build)")
    else()
      message(STATUS "dtf: LibTorch found (${Torch_DIR}): dtf::torch defined")
    endif()
  endif()
else()
  message(STATUS "dtf: LibTorch not found: dtf::torch not defined (apt-get install libtorch-dev)")
endif()
