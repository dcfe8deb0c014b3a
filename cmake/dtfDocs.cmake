# dtf's API reference: Doxygen over include/dtf/, configured from docs/api/Doxyfile.in.
#   cmake --build build --target dtf_docs   ->  build/docs/api/html/index.html
# and the test api_reference_builds, which runs the same configuration into a directory of
# its own and fails on any Doxygen warning (an undocumented public entity, a broken
# reference, a malformed comment). Both exist only where doxygen is found (Debian: doxygen),
# and only when dtf is the top-level project.
include_guard(GLOBAL)
if(NOT PROJECT_IS_TOP_LEVEL)
  return()
endif()

find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(STATUS "dtf: doxygen not found: no dtf_docs target, no api_reference_builds test")
  return()
endif()

# The filter that turns each header's opening comment into its file page (POSIX awk; without
# one the file pages are bare).
find_program(DTF_AWK NAMES awk mawk gawk)
mark_as_advanced(DTF_AWK)
set(DTF_DOXYGEN_INPUT_FILTER "")
if(DTF_AWK)
  set(DTF_DOXYGEN_INPUT_FILTER "\"${DTF_AWK} -f ${PROJECT_SOURCE_DIR}/docs/api/header_comment_filter.awk\"")
endif()

set(_dtf_docs_dir ${PROJECT_BINARY_DIR}/docs)
set(DTF_DOCS_OUTPUT_DIR ${_dtf_docs_dir}/api)
configure_file(${PROJECT_SOURCE_DIR}/docs/api/Doxyfile.in ${_dtf_docs_dir}/Doxyfile @ONLY)
# The test's configuration: the same, with output of its own (a test run never overwrites
# the reference that dtf_docs built).
file(CONFIGURE OUTPUT ${_dtf_docs_dir}/Doxyfile.test
  CONTENT "@INCLUDE = ${_dtf_docs_dir}/Doxyfile\nOUTPUT_DIRECTORY = ${_dtf_docs_dir}/api_test\n")

add_custom_target(dtf_docs
  COMMAND ${DOXYGEN_EXECUTABLE} ${_dtf_docs_dir}/Doxyfile
  WORKING_DIRECTORY ${_dtf_docs_dir}
  COMMENT "Doxygen: the API reference in ${DTF_DOCS_OUTPUT_DIR}/html"
  VERBATIM)

if(DTF_BUILD_TESTS)
  add_test(NAME api_reference_builds COMMAND ${DOXYGEN_EXECUTABLE} ${_dtf_docs_dir}/Doxyfile.test
    WORKING_DIRECTORY ${_dtf_docs_dir})
  set_tests_properties(api_reference_builds PROPERTIES TIMEOUT 300 LABELS docs)
endif()
unset(_dtf_docs_dir)
