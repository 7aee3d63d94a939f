// The CPU's FP8 casts (dtrain/kernels/fp8.h): plain loops, for the emulated FP8 GEMMs of the executor.
#include "dtrain/kernels/fp8.h"

#include <cmath>

namespace dtrain::kernels::cpu {

namespace {

float value(float x) { return x; }
float value(bf16 x) { return from_bf16(x); }

template <typename T>
float amax_of(std::int64_t n, const T* x) {
  float m = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = std::fabs(value(x[i]));
    if (std::isnan(v)) return v;
    m = v > m ? v : m;
  }
  return m;
}

}  // namespace

float amax(std::int64_t n, const float* x) { return amax_of(n, x); }
float amax(std::int64_t n, const bf16* x) { return amax_of(n, x); }

void fp8_dequantised(std::int64_t n, const float* x, float scale, Fp8Kind kind, float* y) {
  const float inverse = 1.0f / scale;  // exact: scale is a power of two
  for (std::int64_t i = 0; i < n; ++i) y[i] = round_to_fp8(x[i] * scale, kind) * inverse;
}

void fp8_dequantised(std::int64_t n, const bf16* x, float scale, Fp8Kind kind, bf16* y) {
  const float inverse = 1.0f / scale;
  for (std::int64_t i = 0; i < n; ++i) y[i] = to_bf16(round_to_fp8(from_bf16(x[i]) * scale, kind) * inverse);
}

}  // namespace dtrain::kernels::cpu
