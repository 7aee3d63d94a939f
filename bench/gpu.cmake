# dtrain::kernels_cuda benchmark (built when CUDA is enabled): GEMM TFLOP/s, fused attention forward/backward, AdamW
# bandwidth on one GPU. Without a GPU it says so and measures nothing.
if(TARGET dtrain::kernels_cuda)
  dtrain_executable(gpu_kernels_bench SOURCES gpu_kernels_bench.cc DEPS dtrain::kernels_cuda CLI11::CLI11)
endif()
