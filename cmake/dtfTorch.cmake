# dtf::torch — the LibTorch adapter (include/dtf/torch/): an INTERFACE target linking dtf::dtf
# and LibTorch, defined only when find_package(Torch) succeeds and the build is for the CPU
# (Debian's LibTorch has no CUDA). DTF_HAVE_TORCH tells the rest of the build.
#
# Included by dtf's own CMakeLists.txt (the build tree, add_subdirectory too) and by the
# installed package's dtfConfig.cmake for find_package(dtf COMPONENTS torch). LibTorch's
# imported targets (torch, c10, ...) are made global when this file's find_package(Torch)
# creates them: an imported target is otherwise visible only in the directory that found it,
# and a project that adds dtf with add_subdirectory could not link dtf::torch without calling
# find_package(Torch) itself first.
include_guard(GLOBAL)
set(DTF_HAVE_TORCH OFF)
if(NOT DTF_CUDA)
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
    message(STATUS "dtf: LibTorch found (${Torch_DIR}): dtf::torch defined")
  else()
    message(STATUS "dtf: LibTorch not found: dtf::torch not defined (apt-get install libtorch-dev)")
  endif()
endif()
