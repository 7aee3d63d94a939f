// Internal: what a Context holds. Included by the backend's sources only (it needs the CUDA and cuBLASLt headers).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda {

namespace detail {

// Which GEMM of linear.h, with which output type.
enum class MatmulKind : int {
  kForwardBf16 = 0,
  kForwardFp32 = 1,
  kBackwardInput = 2,
  kBackwardWeight = 3,
  kFp8Bf16 = 4,  // an FP8 GEMM with a bf16 output (linear_fp8.cc)
  kFp8Fp32 = 5,  // ... accumulated into fp32
};

// Everything cuBLASLt's algorithm choice depends on: the operation, the sizes and the alignment of each pointer.
struct MatmulKey {
  MatmulKind kind{};
  int operand_types = 0;  // FP8 GEMMs: 2 * (A is E5M2) + (B is E5M2); 0 for bf16 ones
  std::int64_t m = 0, n = 0, k = 0;
  bool bias = false;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0;
  auto operator<=>(const MatmulKey&) const = default;  // NOLINT(modernize-use-nullptr): clang 14 flags defaulted <=>
};

// Descriptors and the chosen algorithm of one MatmulKey; destroyed with the context.
struct MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // c describes both C and D
  cublasLtMatmulAlgo_t algo{};
  bool bias_in_epilogue = false;  // false with a bias: the caller adds it with bias_add
  MatmulPlan() = default;
  MatmulPlan(const MatmulPlan&) = delete;
  MatmulPlan& operator=(const MatmulPlan&) = delete;
  ~MatmulPlan();
};

// Throws dtrain::Error for a failed cuBLASLt call.
void check_cublas(cublasStatus_t status, const char* what, const char* file, int line);

// Checks that kernels compiled into this library can run on the current device (cudaFuncGetAttributes on a probe
// kernel): cudaSuccess, or why not (typically cudaErrorNoKernelImageForDevice for a GPU older than the architectures
// the library was built for).
cudaError_t probe_kernel_image();

}  // namespace detail

struct Context::Impl {
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // Waits for the stream, then releases everything below (never throws: errors go to stderr).
  ~Impl();

  int device = 0;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  bool sync_after_launch = false;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;  // cuBLAS (grouped GEMMs), made on first use (grouped_linear.cc)
  std::int64_t grouped_fallbacks = 0;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  std::unique_ptr<DevicePool> pool;
  std::map<detail::MatmulKey, std::unique_ptr<detail::MatmulPlan>> matmul_plans;
};

}  // namespace dtrain::kernels::cuda

#define DTRAIN_CUBLAS_CHECK(call) ::dtrain::kernels::cuda::detail::check_cublas((call), #call, __FILE__, __LINE__)
