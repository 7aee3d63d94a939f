# dtrain::kernels benchmarks: one transformer layer, op by op (kernels_layer_bench), and the same layer in PyTorch
# (kernels_torch.py); bench/kernels_vs_torch.sh runs both and prints one table.
dtrain_executable(kernels_layer_bench SOURCES kernels_layer_bench.cc DEPS dtrain::kernels CLI11::CLI11)
