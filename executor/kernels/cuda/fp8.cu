// FP8 amaxes and casts on the GPU (dtrain/kernels/cuda/fp8.h).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/context_impl.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/fp8.h"

namespace dtrain::kernels::cuda {

namespace {

using detail::as_device;
using detail::global_thread;
using detail::grid_threads;
using detail::kThreads;
using detail::stream_of;

// |x| of non-negative floats ordered as their bits: atomicMax on the unsigned bits is a float max (NaN, 0x7fc00000,
// above every finite value and infinity).
__global__ void __launch_bounds__(kThreads) amax_kernel(std::int64_t n, const __nv_bfloat16* x, unsigned* amax) {
  float m = 0.0f;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = fabsf(__bfloat162float(x[i]));
    m = (v > m || isnan(v)) ? v : m;
  }
  // One atomic per warp: the warp's largest first.
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_down_sync(0xffffffffu, m, offset);
    m = (other > m || isnan(other)) ? other : m;
  }
  if ((threadIdx.x & 31) == 0) atomicMax(amax, __float_as_uint(m));
}

__global__ void record_kernel(const float* amax, float* seen) {
  const float a = *amax, s = *seen;
  *seen = (a > s || isnan(a)) ? a : s;
}

__global__ void __launch_bounds__(kThreads) roll_kernel(std::int64_t n, float* seen, float* previous) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    previous[i] = seen[i];
    seen[i] = 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads)
    cast_kernel(std::int64_t rows, std::int64_t cols, const __nv_bfloat16* x, const float* amax, Fp8Kind format,
                std::uint8_t* q, std::uint8_t* qt, std::int64_t qt_ld, float* descale) {
  const float scale = fp8_scale(*amax, format);  // the CPU's function (dtrain/kernels/fp8.h)
  const __nv_fp8_interpretation_t kind = format == Fp8Kind::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const std::int64_t n = rows * cols;
  if (global_thread() == 0) *descale = 1.0f / scale;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const __nv_fp8_storage_t v = __nv_cvt_float_to_fp8(__bfloat162float(x[i]) * scale, __NV_SATFINITE, kind);
    if (q != nullptr) q[i] = v;
    if (qt != nullptr) {
      const std::int64_t r = i / cols, c = i % cols;
      qt[c * qt_ld + r] = v;
    }
  }
}

}  // namespace

void fp8_amax(Context& ctx, std::int64_t n, const bf16* x, float* amax) {
  DTRAIN_CHECK(n >= 0, "fp8_amax: negative size");
  DTRAIN_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream_of(ctx)));
  if (n == 0) return;
  amax_kernel<<<detail::grid_for(n), kThreads, 0, stream_of(ctx)>>>(n, as_device(x), reinterpret_cast<unsigned*>(amax));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "fp8_amax");
}

void fp8_record_amax(Context& ctx, const float* amax, float* seen) {
  record_kernel<<<1, 1, 0, stream_of(ctx)>>>(amax, seen);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "fp8_record_amax");
}

void fp8_roll_history(Context& ctx, std::int64_t n, float* seen, float* previous) {
  DTRAIN_CHECK(n >= 0, "fp8_roll_history: negative size");
  if (n == 0) return;
  roll_kernel<<<detail::grid_for(n), kThreads, 0, stream_of(ctx)>>>(n, seen, previous);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "fp8_roll_history");
}

void fp8_cast(Context& ctx, std::int64_t rows, std::int64_t cols, const bf16* x, const float* amax, Fp8Kind kind,
              std::uint8_t* q, std::uint8_t* qt, std::int64_t qt_ld, float* descale) {
  DTRAIN_CHECK(rows >= 0 && cols >= 0 && (qt == nullptr || qt_ld >= rows), "fp8_cast: bad size");
  if (qt != nullptr && qt_ld > rows && cols > 0) {
    DTRAIN_CUDA_CHECK(cudaMemsetAsync(qt, 0, static_cast<std::size_t>(cols * qt_ld), stream_of(ctx)));
  }
  const std::int64_t n = rows * cols;
  cast_kernel<<<detail::grid_for(n > 0 ? n : 1), kThreads, 0, stream_of(ctx)>>>(rows, cols, as_device(x), amax, kind, q,
                                                                                qt, qt_ld, descale);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "fp8_cast");
}

}  // namespace dtrain::kernels::cuda
