// dtrain::bf16 (dtrain/common/bf16.h): a type of its own, not an integer; conversions that round to nearest, ties
// to even, as the device's __float2bfloat16 does; infinities, overflow and NaN; every bf16 round-trips exactly.
#include "dtrain/common/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <type_traits>

namespace dtrain {

// gtest prints a failing bf16 as its bits.
void PrintTo(bf16 x, std::ostream* os) { *os << "bf16 bits 0x" << std::hex << x.bits << std::dec; }

namespace {

// ---- a distinct type ----------------------------------------------------------------------------------------------
// A bf16 buffer must never be taken for integers (nor integers for bf16 values): no conversion either way, implicit
// or explicit, and no arithmetic.
static_assert(!std::is_same_v<bf16, std::uint16_t>);
static_assert(!std::is_arithmetic_v<bf16> && !std::is_integral_v<bf16>);
static_assert(!std::is_convertible_v<int, bf16> && !std::is_convertible_v<std::uint16_t, bf16>);
static_assert(!std::is_convertible_v<bf16, int> && !std::is_convertible_v<bf16, std::uint16_t>);
static_assert(!std::is_convertible_v<float, bf16> && !std::is_convertible_v<bf16, float>);
static_assert(!std::is_constructible_v<bf16, int> && !std::is_constructible_v<bf16, std::uint16_t>);
static_assert(!std::is_constructible_v<bf16, float> && !std::is_constructible_v<int, bf16>);
static_assert(!std::is_assignable_v<bf16&, int> && !std::is_assignable_v<bf16&, float>);
// ... stored as the 16 bits of __nv_bfloat16, copied and reinterpreted as such.
static_assert(sizeof(bf16) == 2 && alignof(bf16) == alignof(std::uint16_t));
static_assert(std::is_trivially_copyable_v<bf16> && std::is_trivially_default_constructible_v<bf16>);
// ... and usable in constant expressions.
static_assert(to_bf16(1.0f) == bf16::from_bits(0x3f80));
static_assert(from_bf16(bf16::from_bits(0xc000)) == -2.0f);
static_assert(bf16{} == bf16::from_bits(0) && bf16{} != to_bf16(-0.0f));

TEST(Bf16, ValueInitialisedIsPositiveZero) {
  const bf16 x{};
  EXPECT_EQ(x.bits, 0u);
  EXPECT_EQ(from_bf16(x), 0.0f);
  EXPECT_FALSE(std::signbit(from_bf16(x)));
}

TEST(Bf16, EqualityComparesBitPatterns) {
  EXPECT_EQ(bf16::from_bits(0x7fc0), bf16::from_bits(0x7fc0));  // a NaN equals itself
  EXPECT_NE(to_bf16(0.0f), to_bf16(-0.0f));                     // +0 and -0 differ
  EXPECT_NE(to_bf16(1.0f), to_bf16(-1.0f));
}

// ---- rounding -----------------------------------------------------------------------------------------------------

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(to_bf16(1.0f), bf16::from_bits(0x3f80));
  EXPECT_EQ(to_bf16(-2.0f), bf16::from_bits(0xc000));
  EXPECT_EQ(from_bf16(bf16::from_bits(0x3f80)), 1.0f);
  // 1 + 2^-8 lies halfway between 1 (even mantissa) and 1 + 2^-7: ties go to the even one.
  EXPECT_EQ(to_bf16(1.0f + 0x1.0p-8f), bf16::from_bits(0x3f80));
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(to_bf16(1.0f + 3 * 0x1.0p-8f), bf16::from_bits(0x3f82));
  // Just above the halfway point rounds up; just below, down.
  EXPECT_EQ(to_bf16(std::nextafter(1.0f + 0x1.0p-8f, 2.0f)), bf16::from_bits(0x3f81));
  EXPECT_EQ(to_bf16(std::nextafter(1.0f + 3 * 0x1.0p-8f, 0.0f)), bf16::from_bits(0x3f81));
  // Negative ties: the same, mirrored.
  EXPECT_EQ(to_bf16(-(1.0f + 0x1.0p-8f)), bf16::from_bits(0xbf80));
  EXPECT_EQ(to_bf16(-(1.0f + 3 * 0x1.0p-8f)), bf16::from_bits(0xbf82));
  // A mantissa carry moves to the next binade: just under 2, rounded up, is exactly 2.
  EXPECT_EQ(to_bf16(std::nextafter(2.0f, 0.0f)), bf16::from_bits(0x4000));
}

TEST(Bf16, SubnormalsRoundLikeNormals) {
  const float smallest_subnormal = std::numeric_limits<float>::denorm_min();  // bits 0x00000001: below half a bf16 ulp
  EXPECT_EQ(to_bf16(smallest_subnormal), bf16::from_bits(0x0000));
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x00008000u)), bf16::from_bits(0x0000));    // a tie: to even (0)
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x00018000u)), bf16::from_bits(0x0002));    // a tie: to even (2)
  EXPECT_EQ(from_bf16(bf16::from_bits(0x0001)), std::bit_cast<float>(0x00010000u));  // smallest bf16 subnormal
}

TEST(Bf16, OverflowInfinityAndNaN) {
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()), bf16::from_bits(0x7f80));  // rounds up past the largest: +inf
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::max()), bf16::from_bits(0xff80));
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()), bf16::from_bits(0x7f80));
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::infinity()), bf16::from_bits(0xff80));
  EXPECT_EQ(from_bf16(bf16::from_bits(0x7f80)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::quiet_NaN()), bf16::from_bits(0x7fc0));
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::quiet_NaN()), bf16::from_bits(0xffc0));
  // A NaN whose payload sits only in the low 16 bits would become infinity if truncated; it must stay a NaN, and
  // every NaN becomes the one quiet NaN of its sign.
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x7f800001u)), bf16::from_bits(0x7fc0));
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0xff80ffffu)), bf16::from_bits(0xffc0));
  EXPECT_EQ(to_bf16(std::bit_cast<float>(0x7fffffffu)), bf16::from_bits(0x7fc0));  // would carry into the sign
  EXPECT_TRUE(std::isnan(from_bf16(bf16::from_bits(0x7f81))));
}

TEST(Bf16, EveryBf16RoundTripsExactly) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const bf16 x = bf16::from_bits(static_cast<std::uint16_t>(bits));
    const float f = from_bf16(x);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f), bits << 16);
    if (std::isnan(f)) continue;
    ASSERT_EQ(to_bf16(f), x) << "bits 0x" << std::hex << bits;
    ASSERT_EQ(round_to_bf16(f), f);
  }
}

// Against a definition of "nearest, ties to even" that shares no code with to_bf16: of the two bf16 values around x
// (x truncated, and the next one up in magnitude), the closer in exact (double) arithmetic, the even one on a tie.
TEST(Bf16, MatchesNearestTiesToEvenOnRandomFloats) {
  std::mt19937 rng(20261124);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (!std::isfinite(x)) continue;
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    const auto low = static_cast<std::uint16_t>(bits >> 16);  // toward zero
    const auto high = static_cast<std::uint16_t>(low + 1);    // away from zero (may be infinity)
    // Past the largest bf16, "the next one up" is 2^128 as if the exponent went on: IEEE's overflow to infinity.
    const bool high_is_inf = (high & 0x7fffu) == 0x7f80u;
    const double high_value = high_is_inf ? std::copysign(0x1p128, x) : from_bf16(bf16::from_bits(high));
    const double d_low = std::fabs(static_cast<double>(x) - from_bf16(bf16::from_bits(low)));
    const double d_high = std::fabs(static_cast<double>(x) - high_value);
    const std::uint16_t expected = d_low < d_high ? low : (d_high < d_low ? high : ((low & 1u) == 0 ? low : high));
    ASSERT_EQ(to_bf16(x), bf16::from_bits(expected)) << "float bits 0x" << std::hex << bits;
  }
}

}  // namespace
}  // namespace dtrain
