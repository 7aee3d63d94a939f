// Internal helpers of the CPU kernels: vectorisable math, fixed-order reductions, multi-ISA compilation.
//
// Why these exist instead of std::exp and plain loops:
// - libm calls inside a loop stop the compiler from vectorising it; exp_nonpos() below is pure arithmetic, so a loop
//   of it becomes 8 or 16 lanes wide.
// - A float sum vectorised by the compiler changes its order with the vector width (and is not vectorised at all
//   without -ffast-math). The reductions here keep kLanes partial sums, always the same lanes, combined in a fixed
//   tree, so the result is the same on every instruction set and every run.
// - DTRAIN_KERNEL_CLONES compiles a function for AVX-512, AVX2 and baseline x86-64 and picks one at load time
//   (GCC target_clones, an ifunc): the build stays portable and still uses the machine's vector width. The helpers
//   below are always_inline so that they are compiled for the ISA of the clone they are inlined into.
#pragma once

#include <bit>
#include <cstdint>

// Not under ThreadSanitizer: the ifunc resolver runs while the dynamic loader relocates the program, before the TSan
// runtime is initialised, and its instrumentation crashes there (the TSan build then runs the baseline code only).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DTRAIN_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DTRAIN_KERNEL_CLONES
#endif

#define DTRAIN_INLINE inline __attribute__((always_inline))

namespace dtrain::kernels::cpu::vec {

// Number of partial sums every reduction keeps (one AVX-512 register, two AVX2 registers).
inline constexpr int kLanes = 16;

// e^x for x <= 0 (x = -inf gives 0), relative error about 2 ulp, vectorisable.
// Cephes expf: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two constants so that n*C1 is exact), e^r by a degree-6
// polynomial, 2^n assembled in the exponent bits. Arguments below -87.3 (where e^x is no longer a normal float) give
// 0; the kernels only need e^x of non-positive numbers (softmax after max subtraction, sigmoid on its stable side).
DTRAIN_INLINE float exp_nonpos(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kC1 = 0.693359375f;
  constexpr float kC2 = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
  const float xc = x < -87.0f ? -87.0f : x;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kC1) - n * kC2;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  const float y = p * std::bit_cast<float>(bits);
  return x < -87.0f ? 0.0f : y;
}

// 1 / (1 + e^-x), computed on the side where the exponential does not overflow: e^-|x| is in (0, 1].
DTRAIN_INLINE float sigmoid(float x) {
  const float e = exp_nonpos(x > 0.0f ? -x : x);
  const float s = 1.0f / (1.0f + e);
  return x > 0.0f ? s : e * s;
}

// Fixed-order sum of x[0..n): kLanes interleaved partial sums, then a pairwise tree.
DTRAIN_INLINE float combine(float* acc) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  return acc[0];
}

DTRAIN_INLINE float sum(const float* x, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k];
  }
  for (int k = 0; i + k < n; ++k) acc[k] += x[i + k];
  return combine(acc);
}

DTRAIN_INLINE float dot(const float* x, const float* y, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k] * y[i + k];
  }
  for (int k = 0; i + k < n; ++k) acc[k] += x[i + k] * y[i + k];
  return combine(acc);
}

// Sum of (x - c)^2.
DTRAIN_INLINE float sum_sq_dev(const float* x, float c, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float d = x[i + k] - c;
      acc[k] += d * d;
    }
  }
  for (int k = 0; i + k < n; ++k) {
    const float d = x[i + k] - c;
    acc[k] += d * d;
  }
  return combine(acc);
}

// max is exact in any order, so a plain loop is deterministic; it still keeps lanes so that it vectorises.
DTRAIN_INLINE float max(const float* x, std::int64_t n) {
  float acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = -__builtin_inff();
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  }
  for (int k = 0; i + k < n; ++k) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] = acc[k + width] > acc[k] ? acc[k + width] : acc[k];
  }
  return acc[0];
}

}  // namespace dtrain::kernels::cpu::vec
