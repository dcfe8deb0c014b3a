# The first code block under README's "## Using the library" must be tests/consumer/main.cpp,
# byte for byte (the install_and_consume test builds and runs that file).
# Arguments: README, PROGRAM.
file(READ ${README} readme)
string(FIND "${readme}" "## Using the library" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README has no '## Using the library' section")
endif()
string(SUBSTRING "${readme}" ${at} -1 section)
string(FIND "${section}" "\n```" open)
if(open EQUAL -1)
  message(FATAL_ERROR "no code block under '## Using the library'")
endif()
math(EXPR open "${open} + 1")
string(SUBSTRING "${section}" ${open} -1 rest)  # from the opening fence
string(FIND "${rest}" "\n" line_end)           # the opening fence's line (```cpp)
math(EXPR body_at "${line_end} + 1")
string(SUBSTRING "${rest}" ${body_at} -1 rest)
string(FIND "${rest}" "```" close)
string(SUBSTRING "${rest}" 0 ${close} block)
file(READ ${PROGRAM} program)
if(NOT block STREQUAL program)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/readme_block.cpp "${block}")
  message(FATAL_ERROR "README's first program differs from ${PROGRAM} (extracted: "
                      "${CMAKE_CURRENT_BINARY_DIR}/readme_block.cpp)")
endif()
message("README's first program is ${PROGRAM}")
