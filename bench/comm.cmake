# comm_bench: dtrain::comm all-reduce, reduce-scatter, all-gather and point-to-point latency/bandwidth, Gloo processes
# on loopback or inproc threads; prints a table (--json for the numbers). Run: build/bin/comm_bench --ranks 2,4
dtrain_executable(comm_bench SOURCES comm_bench.cc DEPS dtrain::comm CLI11::CLI11 nlohmann_json::nlohmann_json)
