// FP8: the two 8-bit float formats of Hopper's tensor cores, per-tensor scaling, and the CPU's emulation of an FP8
// GEMM.
//
// Formats (OCP 8-bit floating point, as NVIDIA's __nv_fp8_e4m3 and __nv_fp8_e5m2 store them):
//   E4M3: 4 exponent bits (bias 7), 3 mantissa bits; no infinities; largest 448; smallest normal 2^-6, subnormals
//         down to 2^-9. The forward pass's format (weights and activations).
//   E5M2: 5 exponent bits (bias 15), 2 mantissa bits; largest finite 57344; smallest normal 2^-14, subnormals down to
//         2^-16. The gradients' format in the "hybrid" recipe (more range, less precision).
// round_to_fp8 rounds to the nearest value of the format, ties to even, and saturates at +-largest (as Transformer
// Engine's casts do); a NaN stays NaN.
//
// Scaling: a tensor x is cast as q = round_to_fp8(x * s) with one scale s per tensor, so that its largest magnitude
// (amax) lands near the format's largest value: s = 2^floor(log2(largest / amax)). Scales are powers of two, so
// x * s and q / s are exact and q / s (the dequantised value) is exactly representable in bf16 and fp32: a GEMM over
// the dequantised operands with fp32 accumulation is the FP8 GEMM (fp32 accumulation, then the descale 1 / (s_a s_b))
// exactly. That is the CPU's emulation; the cuBLASLt FP8 GEMMs of the CUDA backend use the same scales (fp8_scale is
// host and device code alike). amax = 0 (an all-zero tensor) and a non-finite amax give s = 1.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "dtrain/common/bf16.h"
#include "dtrain/common/host_device.h"

namespace dtrain::kernels {

enum class Fp8Kind { kE4M3, kE5M2 };

// The largest finite value of the format: 448 (E4M3), 57344 (E5M2).
DTRAIN_HOST_DEVICE constexpr float fp8_max(Fp8Kind kind) { return kind == Fp8Kind::kE4M3 ? 448.0f : 57344.0f; }

// The power-of-two scale for a tensor whose largest magnitude is amax (see above), from the bits of largest / amax:
// its exponent is floor(log2), kept within [-126, 126] (an amax so small that the ratio overflows gives 2^126).
DTRAIN_HOST_DEVICE constexpr float fp8_scale(float amax, Fp8Kind kind) {
  const std::uint32_t amax_bits = __builtin_bit_cast(std::uint32_t, amax);
  if (!(amax > 0.0f) || (amax_bits & 0x7f800000u) == 0x7f800000u) return 1.0f;
  const std::uint32_t ratio_bits = __builtin_bit_cast(std::uint32_t, fp8_max(kind) / amax);
  int exponent = static_cast<int>((ratio_bits >> 23) & 0xffu) - 127;
  exponent = exponent > 126 ? 126 : exponent < -126 ? -126 : exponent;
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(exponent + 127) << 23);
}

// x rounded to the format (see above). Inline: the casts' loops call it per element.
inline float round_to_fp8(float x, Fp8Kind kind) {
  const bool e4m3 = kind == Fp8Kind::kE4M3;
  const int mantissa_bits = e4m3 ? 3 : 2, min_normal_exponent = e4m3 ? -6 : -14;
  const float largest = fp8_max(kind);
  const float magnitude = std::fabs(x);
  if (!(magnitude < largest)) return std::isnan(x) ? x : std::copysign(largest, x);
  // The format's spacing around x is 2^q, q = max(e, the smallest normal exponent) - mantissa bits for x in
  // [2^e, 2^(e+1)). Adding and subtracting C = 2^(q+23) rounds to a multiple of 2^q, ties to even (IEEE
  // round-to-nearest; magnitude < C, so the sum keeps 2^q as its last place). The build has no -ffast-math, so the
  // compiler keeps both roundings.
  const int e = static_cast<int>((std::bit_cast<std::uint32_t>(magnitude) >> 23) & 0xff) - 127;
  const int q = (e > min_normal_exponent ? e : min_normal_exponent) - mantissa_bits;
  const float c = std::bit_cast<float>(static_cast<std::uint32_t>(q + 23 + 127) << 23);
  const float rounded = (magnitude + c) - c;
  return std::copysign(rounded < largest ? rounded : largest, x);
}

namespace cpu {

// max_i |x[i]| over n elements (0 for n = 0; NaN when an element is NaN).
float amax(std::int64_t n, const float* x);
float amax(std::int64_t n, const bf16* x);
// y[i] = round_to_fp8(x[i] * scale, kind) / scale: x cast to FP8 and back (y may alias x).
void fp8_dequantised(std::int64_t n, const float* x, float scale, Fp8Kind kind, float* y);
void fp8_dequantised(std::int64_t n, const bf16* x, float scale, Fp8Kind kind, bf16* y);

}  // namespace cpu
}  // namespace dtrain::kernels
