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

function(dtrain_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest_main GTest::gmock)
  _dtrain_common_target_settings(${name})
  target_compile_definitions(${name} PRIVATE
    DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}" DTRAIN_BINARY_DIR="${PROJECT_BINARY_DIR}")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT ${ARG_TIMEOUT})
  # Labels are set by a script ctest runs after the discovered tests are defined: a list of several labels passed
  # through gtest_discover_tests(PROPERTIES) loses its separators on the way (only "unit" would stick, and
  # `ctest -L concurrent` would find nothing). ${name}_TESTS is the list the discovery script defines.
  set(_dtrain_labels_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
  file(WRITE ${_dtrain_labels_file}
    "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_dtrain_labels_file})
endfunction()
