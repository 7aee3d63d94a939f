// bfloat16 storage for the CUDA backend, usable from code compiled without CUDA headers.
//
// A bf16 value is the upper 16 bits of an IEEE-754 binary32 (1 sign, 8 exponent, 7 mantissa bits): the bits of CUDA's
// __nv_bfloat16, carried here as std::uint16_t so that the executor, checkpoints and tests can hold, convert and
// compare bf16 tensors with plain g++. Device code reinterprets the same storage as __nv_bfloat16.
//
// Conversions on the host round as the device's __float2bfloat16 does (round to nearest, ties to even; overflow to
// infinity); a NaN stays a NaN (0x7fc0 with the input's sign: quiet, and distinct from every finite value).
#pragma once

#include <bit>
#include <cstdint>

namespace dtrain::kernels::cuda {

using bf16 = std::uint16_t;

// The float whose bits are x's followed by 16 zero bits (exact: every bf16 is a float).
constexpr float from_bf16(bf16 x) { return std::bit_cast<float>(static_cast<std::uint32_t>(x) << 16); }

// Nearest bf16 to x, ties to even.
constexpr bf16 to_bf16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<bf16>(((bits >> 16) & 0x8000u) | 0x7fc0u);  // NaN: keep it a (quiet) NaN
  }
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // half an ulp, plus one when the kept lsb is odd
  return static_cast<bf16>((bits + rounding) >> 16);
}

// x rounded to the nearest bf16 value, as a float.
constexpr float round_to_bf16(float x) { return from_bf16(to_bf16(x)); }

}  // namespace dtrain::kernels::cuda
