# Helpers that keep every part's CMakeLists.txt short and alike.
#
#   dtrain_library(<name> SOURCES ... DEPS ... [PRIVATE_DEPS ...])
#       static library dtrain_<name>, alias dtrain::<name>; public headers in <part>/include.
#   dtrain_executable(<name> SOURCES ... DEPS ...)
#   dtrain_test(<name> SOURCES ... DEPS ... [LABELS ...] [TIMEOUT s])
#       GoogleTest program; every TEST becomes a ctest test.

set(DTRAIN_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wunused
    -Woverloaded-virtual -Wformat=2 -Wimplicit-fallthrough)
if(DTRAIN_WERROR)
  list(APPEND DTRAIN_WARNINGS -Werror)
endif()

if(DTRAIN_SANITIZE)
  string(REPLACE ";" "," _dtrain_san "${DTRAIN_SANITIZE}")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${_dtrain_san}> $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${_dtrain_san})
  # UBSan without its null and alignment checks: with GCC they are most of its cost, doubling the compile time of
  # an ASan+UBSan build (planner/src/ir's unity file: 39.8 s with them, 23.3 s without, 19.9 s with ASan alone). A
  # null dereference still stops an ASan run (SEGV on address 0x0, with its stack); x86 loads misaligned data.
  if("undefined" IN_LIST DTRAIN_SANITIZE)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize=null,alignment>)
  endif()
endif()

# Hardening for everything dtrain builds (the SPANK plugin runs inside root's slurmstepd; the programs are run by
# users on shared nodes), as pyxis builds its plugin: FORTIFY (it needs an optimising build, so not in Debug), a
# stack protector, and full RELRO (read-only relocations, every symbol bound at load: BIND_NOW). CUDA sources are
# device code compiled by nvcc and get none of these. tests/build/hardening_test.sh checks the result with readelf.
option(DTRAIN_HARDEN "Build with _FORTIFY_SOURCE=2, -fstack-protector-strong, -z relro -z now" ON)
if(DTRAIN_HARDEN)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fstack-protector-strong>
                      "$<$<AND:$<COMPILE_LANGUAGE:CXX,C>,$<NOT:$<CONFIG:Debug>>>:-U_FORTIFY_SOURCE;-D_FORTIFY_SOURCE=2>")
  add_link_options(LINKER:-z,relro LINKER:-z,now)
endif()

function(_dtrain_common_target_settings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${DTRAIN_WARNINGS}>)
endfunction()

function(dtrain_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(dtrain_${name} STATIC ${ARG_SOURCES})
  add_library(dtrain::${name} ALIAS dtrain_${name})
  target_include_directories(dtrain_${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_link_libraries(dtrain_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  _dtrain_common_target_settings(dtrain_${name})
endfunction()

function(dtrain_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  _dtrain_common_target_settings(${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
endfunction()

# SERIAL: a regular expression; the target's tests whose names match run alone (RUN_SERIAL), for tests that compare
# the timing of processes and would be misled by other tests loading the cores.
function(dtrain_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;SERIAL" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest_main GTest::gmock)
  _dtrain_common_target_settings(${name})
  # The tests' own sources are compiled with -Og (after the configuration's -O2, so it wins): the code they time and
  # train with is the libraries', optimised as shipped; their own is assertions and fixtures, which -O2 made the
  # slowest part of the build (356 of its 695 CPU seconds; -Og takes about 40% less).
  target_compile_options(${name} PRIVATE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<NOT:$<CONFIG:Debug>>>:-Og>)
  target_compile_definitions(${name} PRIVATE
    DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}" DTRAIN_BINARY_DIR="${PROJECT_BINARY_DIR}")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  # Labels are set from a file ctest includes after the discovered tests: passed through gtest_discover_tests'
  # PROPERTIES, a list of labels ("unit;concurrent") is split into separate arguments and only the first survives.
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 TEST_LIST ${name}_TESTS PROPERTIES TIMEOUT ${ARG_TIMEOUT})
  set(_labels_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
  file(WRITE ${_labels_file}
    "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\")\nendif()\n")
  if(ARG_SERIAL)
    file(APPEND ${_labels_file}
      "foreach(_test IN LISTS ${name}_TESTS)\n  if(_test MATCHES \"${ARG_SERIAL}\")\n"
      "    set_tests_properties(\${_test} PROPERTIES RUN_SERIAL TRUE)\n  endif()\nendforeach()\n")
  endif()
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_labels_file})
endfunction()
