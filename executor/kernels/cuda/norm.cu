// LayerNorm and RMSNorm forward and backward: one block per row for the row statistics and dx, deterministic column
// sums (device.cuh) for dgamma and dbeta.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/norm.h"

namespace dtrain::kernels::cuda {

namespace {

using detail::as_device;
using detail::block_reduce;
using detail::kThreads;
using detail::stream_of;
using detail::SumOp;

// One block per row. mean == nullptr: RMSNorm (no centring; beta must be nullptr). Two passes for the statistics
// (sum, then squared deviations from the mean), as the CPU kernels: a large mean costs no digits. The row is re-read
// from the cache for each pass.
__global__ void __launch_bounds__(kThreads)
    norm_forward_kernel(std::int64_t hidden, const __nv_bfloat16* x, const float* gamma, const float* beta, float eps,
                        __nv_bfloat16* y, float* mean, float* rstd) {
  __shared__ float shared[32];
  const std::int64_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * hidden;
  const float inv_h = 1.0f / static_cast<float>(hidden);
  float mu = 0.0f;
  if (mean != nullptr) {
    float s = 0.0f;
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) s += __bfloat162float(xr[j]);
    mu = block_reduce(s, SumOp{}, 0.0f, shared) * inv_h;
  }
  float ss = 0.0f;
  for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float d = __bfloat162float(xr[j]) - mu;
    ss += d * d;
  }
  const float r = 1.0f / sqrtf(block_reduce(ss, SumOp{}, 0.0f, shared) * inv_h + eps);
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = mu;
    rstd[row] = r;
  }
  __nv_bfloat16* yr = y + row * hidden;
  for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float v = (__bfloat162float(xr[j]) - mu) * r * gamma[j];
    yr[j] = __float2bfloat16(beta != nullptr ? v + beta[j] : v);
  }
}

// dx for one row per block: g = dy * gamma, xhat = (x - mean) * rstd,
//   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))     (RMSNorm: without the mean_j(g) term)
__global__ void __launch_bounds__(kThreads)
    norm_backward_dx_kernel(std::int64_t hidden, const __nv_bfloat16* x, const float* gamma, const float* mean,
                            const float* rstd, const __nv_bfloat16* dy, __nv_bfloat16* dx) {
  __shared__ float shared[32];
  const std::int64_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * hidden;
  const __nv_bfloat16* dyr = dy + row * hidden;
  const float inv_h = 1.0f / static_cast<float>(hidden);
  const float mu = mean != nullptr ? mean[row] : 0.0f;
  const float r = rstd[row];
  float sum_g = 0.0f;
  float sum_gx = 0.0f;
  for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float g = __bfloat162float(dyr[j]) * gamma[j];
    sum_g += g;
    sum_gx += g * ((__bfloat162float(xr[j]) - mu) * r);
  }
  const float mean_g = mean != nullptr ? block_reduce(sum_g, SumOp{}, 0.0f, shared) * inv_h : 0.0f;
  const float mean_gx = block_reduce(sum_gx, SumOp{}, 0.0f, shared) * inv_h;
  __nv_bfloat16* dxr = dx + row * hidden;
  for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float g = __bfloat162float(dyr[j]) * gamma[j];
    const float xhat = (__bfloat162float(xr[j]) - mu) * r;
    dxr[j] = __float2bfloat16(r * (g - mean_g - xhat * mean_gx));
  }
}

// The terms of dgamma (dy * xhat) and dbeta (dy) at (row, column).
struct NormParamGradTerms {
  std::int64_t hidden;
  const __nv_bfloat16* x;
  const float* mean;  // nullptr: RMSNorm
  const float* rstd;
  const __nv_bfloat16* dy;
  __device__ void operator()(std::int64_t r, std::int64_t c, float (&v)[2]) const {
    const float mu = mean != nullptr ? mean[r] : 0.0f;
    const float g = __bfloat162float(dy[r * hidden + c]);
    v[0] = g * ((__bfloat162float(x[r * hidden + c]) - mu) * rstd[r]);
    v[1] = g;
  }
};

void check_shape(const NormShape& s, const char* name) {
  DTRAIN_CHECK(s.rows >= 0 && s.hidden >= 0, std::string(name) + ": negative dimension");
  DTRAIN_CHECK(s.rows <= 0x7fffffff, std::string(name) + ": more rows than one launch can hold");
}

void forward(Context& ctx, const NormShape& s, const bf16* x, const float* gamma, const float* beta, float eps, bf16* y,
             float* mean, float* rstd, const char* name) {
  check_shape(s, name);
  if (s.rows == 0 || s.hidden == 0) return;
  norm_forward_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, stream_of(ctx)>>>(
      s.hidden, as_device(x), gamma, beta, eps, as_device(y), mean, rstd);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, name);
}

void backward(Context& ctx, const NormShape& s, const bf16* x, const float* gamma, const float* mean, const float* rstd,
              const bf16* dy, bf16* dx, float* dgamma, float* dbeta, const char* name) {
  check_shape(s, name);
  if (s.rows == 0 || s.hidden == 0) return;
  norm_backward_dx_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, stream_of(ctx)>>>(
      s.hidden, as_device(x), gamma, mean, rstd, as_device(dy), as_device(dx));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, name);
  detail::column_sums<2>(ctx, s.rows, s.hidden, NormParamGradTerms{s.hidden, as_device(x), mean, rstd, as_device(dy)},
                         dgamma, dbeta, name);
}

}  // namespace

void layernorm_forward(Context& ctx, const NormShape& shape, const bf16* x, const float* gamma, const float* beta,
                       float eps, bf16* y, float* mean, float* rstd) {
  DTRAIN_CHECK(mean != nullptr, "layernorm_forward: mean is required");
  forward(ctx, shape, x, gamma, beta, eps, y, mean, rstd, "layernorm_forward");
}

void layernorm_backward(Context& ctx, const NormShape& shape, const bf16* x, const float* gamma, const float* mean,
                        const float* rstd, const bf16* dy, bf16* dx, float* dgamma, float* dbeta) {
  DTRAIN_CHECK(mean != nullptr, "layernorm_backward: mean is required");
  backward(ctx, shape, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, "layernorm_backward");
}

void rmsnorm_forward(Context& ctx, const NormShape& shape, const bf16* x, const float* gamma, float eps, bf16* y,
                     float* rstd) {
  forward(ctx, shape, x, gamma, nullptr, eps, y, nullptr, rstd, "rmsnorm_forward");
}

void rmsnorm_backward(Context& ctx, const NormShape& shape, const bf16* x, const float* gamma, const float* rstd,
                      const bf16* dy, bf16* dx, float* dgamma) {
  backward(ctx, shape, x, gamma, nullptr, rstd, dy, dx, dgamma, nullptr, "rmsnorm_backward");
}

}  // namespace dtrain::kernels::cuda
