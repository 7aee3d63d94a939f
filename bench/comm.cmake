# comm_bench: dtrain::comm all-reduce, reduce-scatter, all-gather and point-to-point latency/bandwidth, Gloo processes
# on loopback or inproc threads; prints a table (--json for the numbers). Run: build/bin/comm_bench --ranks 2,4
dtrain_executable(comm_bench SOURCES comm_bench.cc DEPS dtrain::comm CLI11::CLI11 nlohmann_json::nlohmann_json)

# nccl_bench: all-reduce bus bandwidth of the NCCL backend across message sizes, one thread per GPU; prints a table
# (--json for the numbers), or "no GPU" and exits 0 where none is usable. Run: build/bin/nccl_bench --dtype bf16
if(DTRAIN_ENABLE_CUDA)
  dtrain_executable(nccl_bench SOURCES nccl_bench.cc
    DEPS dtrain::comm_nccl CUDA::cudart CLI11::CLI11 nlohmann_json::nlohmann_json)
endif()
