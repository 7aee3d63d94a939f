// FP8 rounding (dtrain/kernels/fp8.h) against the formats' every value, decoded from their bit layouts here.
#include "dtrain/kernels/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace dtrain::kernels {
namespace {

struct Code {
  float value;
  int bits;
};

// Every finite value of the format with its bit pattern: E4M3 (bias 7, S.1111.111 is NaN, no infinities), E5M2
// (bias 15, exponent 31 is infinity or NaN).
std::vector<Code> finite_values(Fp8Kind kind) {
  const bool e4m3 = kind == Fp8Kind::kE4M3;
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, max_exp = e4m3 ? 15 : 31;
  std::vector<Code> out;
  for (int b = 0; b < 256; ++b) {
    const int exp = (b >> mbits) & ((1 << (7 - mbits)) - 1), man = b & ((1 << mbits) - 1);
    if (e4m3 && exp == max_exp && man == (1 << mbits) - 1) continue;
    if (!e4m3 && exp == max_exp) continue;
    const double frac = static_cast<double>(man) / (1 << mbits);
    double v = exp == 0 ? frac * std::ldexp(1.0, 1 - bias) : (1 + frac) * std::ldexp(1.0, exp - bias);
    if (b & 0x80) v = -v;
    out.push_back({static_cast<float>(v), b});
  }
  return out;
}

class Fp8Formats : public ::testing::TestWithParam<Fp8Kind> {};

TEST_P(Fp8Formats, EveryValueOfTheFormatIsKept) {
  for (const Code& c : finite_values(GetParam())) EXPECT_EQ(round_to_fp8(c.value, GetParam()), c.value) << c.bits;
}

TEST_P(Fp8Formats, LargestValuesAreTheDocumentedOnes) {
  float largest = 0;
  for (const Code& c : finite_values(GetParam())) largest = std::max(largest, c.value);
  EXPECT_EQ(largest, fp8_max(GetParam()));
  EXPECT_EQ(fp8_max(Fp8Kind::kE4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Kind::kE5M2), 57344.0f);
}

// Random values (uniform in the exponent, so subnormals and the top binade are hit), and every midpoint between
// neighbouring values: the nearest value, ties to the even bit pattern.
TEST_P(Fp8Formats, RoundsToTheNearestValueTiesToEven) {
  const Fp8Kind kind = GetParam();
  std::vector<Code> codes = finite_values(kind);
  auto nearest = [&](float x) {
    const Code* best = nullptr;
    double best_d = 0;
    for (const Code& c : codes) {
      const double d = std::fabs(static_cast<double>(c.value) - x);
      if (best == nullptr || d < best_d ||
          (d == best_d && (c.bits & 1) == 0 && std::signbit(c.value) == std::signbit(x))) {
        best = &c;
        best_d = d;
      }
    }
    return best->value;
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> exponent(-20.0f, std::log2(fp8_max(kind)));
  std::vector<float> xs;
  for (int i = 0; i < 4000; ++i) xs.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  std::vector<float> positive;
  for (const Code& c : codes) {
    if (c.value >= 0) positive.push_back(c.value);
  }
  std::sort(positive.begin(), positive.end());
  for (std::size_t i = 0; i + 1 < positive.size(); ++i) {
    const float mid = (positive[i] + positive[i + 1]) / 2;  // exact: one more bit than the format's
    xs.push_back(mid);
    xs.push_back(-mid);
  }
  for (float x : xs) EXPECT_EQ(round_to_fp8(x, kind), nearest(x)) << x;
}

TEST_P(Fp8Formats, SaturatesKeepsSignedZeroAndNan) {
  const Fp8Kind kind = GetParam();
  const float max = fp8_max(kind);
  EXPECT_EQ(round_to_fp8(1e30f, kind), max);
  EXPECT_EQ(round_to_fp8(-1e30f, kind), -max);
  EXPECT_EQ(round_to_fp8(std::numeric_limits<float>::infinity(), kind), max);
  EXPECT_EQ(round_to_fp8(max * 1.01f, kind), max);
  EXPECT_TRUE(std::isnan(round_to_fp8(std::nanf(""), kind)));
  EXPECT_TRUE(std::signbit(round_to_fp8(-0.0f, kind)));
  EXPECT_EQ(round_to_fp8(1e-30f, kind), 0.0f);  // far below the smallest subnormal
}

TEST_P(Fp8Formats, ScalesArePowersOfTwoThatKeepTheAmaxInRange) {
  const Fp8Kind kind = GetParam();
  for (float amax : {1e-20f, 3e-5f, 0.01f, 1.0f, 1.5f, 447.0f, 448.0f, 1000.0f, 6e4f, 1e20f}) {
    const float s = fp8_scale(amax, kind);
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << amax;  // a power of two
    EXPECT_LE(amax * s, fp8_max(kind)) << amax;
    EXPECT_GT(amax * s, fp8_max(kind) / 2) << amax;  // the largest such power
  }
  EXPECT_EQ(fp8_scale(1.0f, Fp8Kind::kE4M3), 256.0f);
  EXPECT_EQ(fp8_scale(0.0f, kind), 1.0f);
  EXPECT_EQ(fp8_scale(std::numeric_limits<float>::infinity(), kind), 1.0f);
  EXPECT_EQ(fp8_scale(std::nanf(""), kind), 1.0f);
}

INSTANTIATE_TEST_SUITE_P(Kinds, Fp8Formats, ::testing::Values(Fp8Kind::kE4M3, Fp8Kind::kE5M2),
                         [](const auto& p) { return p.param == Fp8Kind::kE4M3 ? "E4M3" : "E5M2"; });

// Dequantised values are the format's under the scale, exactly representable in bf16, and a GEMM over them equals
// the FP8 GEMM's descaled result.
TEST(Fp8Casts, DequantisedValuesAreFormatValuesOverTheScaleInFp32AndBf16) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(512);
  for (float& v : x) v = normal(rng);
  x[7] = 0.3f;  // the amax
  EXPECT_EQ(cpu::amax(static_cast<std::int64_t>(x.size()), x.data()), 0.3f);
  const float scale = fp8_scale(0.3f, Fp8Kind::kE4M3);
  EXPECT_EQ(scale, 1024.0f);  // 448 / 0.3 = 1493
  std::vector<float> y(x.size());
  cpu::fp8_dequantised(static_cast<std::int64_t>(x.size()), x.data(), scale, Fp8Kind::kE4M3, y.data());
  std::vector<bf16> xb(x.size()), yb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = to_bf16(x[i]);
  cpu::fp8_dequantised(static_cast<std::int64_t>(x.size()), xb.data(), scale, Fp8Kind::kE4M3, yb.data());
  int changed = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(round_to_fp8(y[i] * scale, Fp8Kind::kE4M3), y[i] * scale) << i;
    EXPECT_EQ(from_bf16(to_bf16(y[i])), y[i]) << i;
    EXPECT_EQ(round_to_fp8(from_bf16(yb[i]) * scale, Fp8Kind::kE4M3), from_bf16(yb[i]) * scale) << i;
    EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) / 16 + std::ldexp(1.0f, -9) / scale) << i;  // half a place
    changed += y[i] != x[i];
  }
  EXPECT_GT(changed, 400);  // three mantissa bits: nearly every value moves
}

}  // namespace
}  // namespace dtrain::kernels
