// dtrain::bf16: one bfloat16 value, as storage. A bf16 is the upper 16 bits of an IEEE-754 binary32 (1 sign,
// 8 exponent, 7 mantissa bits): the bits of CUDA's __nv_bfloat16, held in a type of its own so that the executor,
// the communicators, checkpoints and tests can hold, convert and compare bf16 tensors with plain g++, and so that a
// bf16 buffer is never mistaken for integers (as Gloo's float16 struct in gloo/types.h). Device code reinterprets
// the same storage as __nv_bfloat16 (same size, alignment and bits).
//
// bf16 has no arithmetic and no implicit conversion from or to any number: values go through to_bf16 and from_bf16,
// bit patterns through bf16::from_bits and .bits. == compares bit patterns (so a NaN equals itself and +0 differs
// from -0): what tests of bitwise reproducibility need.
//
// Rounding: to_bf16 rounds as the device's __float2bfloat16 does (round to nearest, ties to even; overflow to
// infinity); a NaN stays a NaN (0x7fc0 with the input's sign: quiet, and distinct from every finite value). The
// functions are constexpr and DTRAIN_HOST_DEVICE (dtrain/common/host_device.h): host and device code call the same
// definition.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dtrain/common/host_device.h"

namespace dtrain {

struct bf16 {
  // Uninitialised, as a built-in number is; bf16{} is +0.
  bf16() = default;

  // The bf16 whose bits are `bits` (any pattern: NaNs and subnormals included, nothing is converted).
  DTRAIN_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t bits) {
    bf16 x{};
    x.bits = bits;
    return x;
  }

  std::uint16_t bits;
};

// NOLINTNEXTLINE(misc-redundant-expression): both sides are 2 by design; that is what is asserted.
static_assert(sizeof(bf16) == sizeof(std::uint16_t) && alignof(bf16) == alignof(std::uint16_t),
              "bf16 is stored as the 16 bits of __nv_bfloat16");
static_assert(std::is_trivially_copyable_v<bf16> && std::is_trivial_v<bf16> && std::is_standard_layout_v<bf16>,
              "bf16 buffers are copied with memcpy and reinterpreted as __nv_bfloat16");

// Same bit pattern.
DTRAIN_HOST_DEVICE constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }

// The float whose bits are x's followed by 16 zero bits (exact: every bf16 is a float).
DTRAIN_HOST_DEVICE constexpr float from_bf16(bf16 x) {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(x.bits) << 16);
}

// Nearest bf16 to x, ties to even; beyond the largest bf16, infinity; NaN: 0x7fc0 with x's sign.
DTRAIN_HOST_DEVICE constexpr bf16 to_bf16(float x) {
  const std::uint32_t bits = __builtin_bit_cast(std::uint32_t, x);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return bf16::from_bits(static_cast<std::uint16_t>(((bits >> 16) & 0x8000u) | 0x7fc0u));  // NaN: a quiet NaN
  }
  // Half an ulp of the kept part, plus one when its lowest bit is odd: ties go to even. A carry out of the mantissa
  // bumps the exponent, and the largest values round up to infinity.
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return bf16::from_bits(static_cast<std::uint16_t>((bits + rounding) >> 16));
}

// x rounded to the nearest bf16 value, as a float.
DTRAIN_HOST_DEVICE constexpr float round_to_bf16(float x) { return from_bf16(to_bf16(x)); }

}  // namespace dtrain
