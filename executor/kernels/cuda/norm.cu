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

using detail::aligned16;
using detail::as_device;
using detail::block_reduce;
using detail::kThreads;
using detail::kVec;
using detail::load8;
using detail::over_row;
using detail::store8;
using detail::stream_of;
using detail::SumOp;

// One block per row. mean == nullptr: RMSNorm (no centring; beta must be nullptr). Two passes for the statistics
// (sum, then squared deviations from the mean), as the CPU kernels: a large mean costs no digits. The row is re-read
// from the cache for each pass. `vec`: the rows, gamma and beta 16-byte aligned, 8 elements a load (over_row).
__global__ void __launch_bounds__(kThreads)
    norm_forward_kernel(std::int64_t hidden, const __nv_bfloat16* x, const float* gamma, const float* beta, float eps,
                        bool vec, __nv_bfloat16* y, float* mean, float* rstd) {
  __shared__ float shared[32];
  const std::int64_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * hidden;
  const float inv_h = 1.0f / static_cast<float>(hidden);
  float mu = 0.0f;
  if (mean != nullptr) {
    float s = 0.0f;
    over_row(
        hidden, vec,
        [&](std::int64_t j0) {
          float v[kVec];
          load8(xr + j0, v);
#pragma unroll
          for (int k = 0; k < kVec; ++k) s += v[k];
        },
        [&](std::int64_t j) { s += __bfloat162float(xr[j]); });
    mu = block_reduce(s, SumOp{}, 0.0f, shared) * inv_h;
  }
  float ss = 0.0f;
  over_row(
      hidden, vec,
      [&](std::int64_t j0) {
        float v[kVec];
        load8(xr + j0, v);
#pragma unroll
        for (int k = 0; k < kVec; ++k) ss += (v[k] - mu) * (v[k] - mu);
      },
      [&](std::int64_t j) {
        const float d = __bfloat162float(xr[j]) - mu;
        ss += d * d;
      });
  const float r = 1.0f / sqrtf(block_reduce(ss, SumOp{}, 0.0f, shared) * inv_h + eps);
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = mu;
    rstd[row] = r;
  }
  __nv_bfloat16* yr = y + row * hidden;
  auto out = [&](float xv, std::int64_t j, float g) {
    const float v = (xv - mu) * r * g;
    return beta != nullptr ? v + beta[j] : v;
  };
  over_row(
      hidden, vec,
      [&](std::int64_t j0) {
        float v[kVec], g[kVec];
        load8(xr + j0, v);
        load8(gamma + j0, g);
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[k] = out(v[k], j0 + k, g[k]);
        store8(yr + j0, v);
      },
      [&](std::int64_t j) { yr[j] = __float2bfloat16(out(__bfloat162float(xr[j]), j, gamma[j])); });
}

// dx for one row per block: g = dy * gamma, xhat = (x - mean) * rstd,
//   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))     (RMSNorm: without the mean_j(g) term)
__global__ void __launch_bounds__(kThreads)
    norm_backward_dx_kernel(std::int64_t hidden, const __nv_bfloat16* x, const float* gamma, const float* mean,
                            const float* rstd, const __nv_bfloat16* dy, bool vec, __nv_bfloat16* dx) {
  __shared__ float shared[32];
  const std::int64_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * hidden;
  const __nv_bfloat16* dyr = dy + row * hidden;
  const float inv_h = 1.0f / static_cast<float>(hidden);
  const float mu = mean != nullptr ? mean[row] : 0.0f;
  const float r = rstd[row];
  // Elements [j0, j0 + 8) of the row's x and dy and of gamma.
  auto load_group = [&](std::int64_t j0, float(&xv)[kVec], float(&dv)[kVec], float(&gv)[kVec]) {
    load8(xr + j0, xv);
    load8(dyr + j0, dv);
    load8(gamma + j0, gv);
  };
  float sum_g = 0.0f;
  float sum_gx = 0.0f;
  over_row(
      hidden, vec,
      [&](std::int64_t j0) {
        float xv[kVec], dv[kVec], gv[kVec];
        load_group(j0, xv, dv, gv);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float g = dv[k] * gv[k];
          sum_g += g;
          sum_gx += g * ((xv[k] - mu) * r);
        }
      },
      [&](std::int64_t j) {
        const float g = __bfloat162float(dyr[j]) * gamma[j];
        sum_g += g;
        sum_gx += g * ((__bfloat162float(xr[j]) - mu) * r);
      });
  const float mean_g = mean != nullptr ? block_reduce(sum_g, SumOp{}, 0.0f, shared) * inv_h : 0.0f;
  const float mean_gx = block_reduce(sum_gx, SumOp{}, 0.0f, shared) * inv_h;
  __nv_bfloat16* dxr = dx + row * hidden;
  auto grad = [&](float xv, float dv, float gm) {
    const float g = dv * gm;
    const float xhat = (xv - mu) * r;
    return r * (g - mean_g - xhat * mean_gx);
  };
  over_row(
      hidden, vec,
      [&](std::int64_t j0) {
        float xv[kVec], dv[kVec], gv[kVec];
        load_group(j0, xv, dv, gv);
#pragma unroll
        for (int k = 0; k < kVec; ++k) xv[k] = grad(xv[k], dv[k], gv[k]);
        store8(dxr + j0, xv);
      },
      [&](std::int64_t j) {
        dxr[j] = __float2bfloat16(grad(__bfloat162float(xr[j]), __bfloat162float(dyr[j]), gamma[j]));
      });
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
  const bool vec =
      s.hidden % kVec == 0 && aligned16(x) && aligned16(gamma) && (beta == nullptr || aligned16(beta)) && aligned16(y);
  norm_forward_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, stream_of(ctx)>>>(
      s.hidden, as_device(x), gamma, beta, eps, vec, as_device(y), mean, rstd);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, name);
}

void backward(Context& ctx, const NormShape& s, const bf16* x, const float* gamma, const float* mean, const float* rstd,
              const bf16* dy, bf16* dx, float* dgamma, float* dbeta, const char* name) {
  check_shape(s, name);
  if (s.rows == 0 || s.hidden == 0) return;
  const bool vec = s.hidden % kVec == 0 && aligned16(x) && aligned16(gamma) && aligned16(dy) && aligned16(dx);
  norm_backward_dx_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, stream_of(ctx)>>>(
      s.hidden, as_device(x), gamma, mean, rstd, as_device(dy), vec, as_device(dx));
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
