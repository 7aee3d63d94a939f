# Store benchmarks: bench/store_vs_tcpstore.sh runs store_bench next to tcpstore_bench.py (PyTorch's TCPStore).
dtrain_executable(store_bench SOURCES store_bench.cc DEPS dtrain::store CLI11::CLI11 fmt::fmt)
