# Topology benchmarks: discovery of this machine and loading the XML fixtures (docs/topology.md#speed).
#   build/bin/topology_bench [--benchmark_filter=...]
dtrain_executable(topology_bench SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/topology_bench.cc
  DEPS dtrain::topology benchmark::benchmark_main)
target_compile_definitions(topology_bench PRIVATE DTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
