# dtf_use_cuda_language(<sources>...): in a DTF_CUDA build, compile these C++ sources with
# nvcc (dtf's headers instantiate Thrust algorithms and must see the CUDA compiler). No effect
# on CPU builds. Call it on every source that includes dtf headers.
include_guard(GLOBAL)
function(dtf_use_cuda_language)
  if(DTF_CUDA)
    set_source_files_properties(${ARGN} PROPERTIES LANGUAGE CUDA)
  endif()
endfunction()

# dtf_add_executable(<name> <sources>...): an executable linked to dtf::dtf, its sources
# compiled for the configured device system.
function(dtf_add_executable name)
  add_executable(${name} ${ARGN})
  dtf_use_cuda_language(${ARGN})
  target_link_libraries(${name} PRIVATE dtf::dtf)
endfunction()

# dtf_header_check_sources(<out-var> <headers>...): one generated translation unit per header
# (included twice: the include guard is checked too), for the "every header compiles on its
# own" checks.
function(dtf_header_check_sources out)
  set(tus)
  foreach(header IN LISTS ARGN)
    string(MAKE_C_IDENTIFIER ${header} id)
    set(tu ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cpp)
    file(CONFIGURE OUTPUT ${tu} CONTENT "#include <${header}>\n#include <${header}>  // include guard\n")
    list(APPEND tus ${tu})
  endforeach()
  set(${out} ${tus} PARENT_SCOPE)
endfunction()
