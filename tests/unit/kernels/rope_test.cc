// RoPE against the float64 reference (angles in float64), on queries and keys inside a fused QKV row.
#include "dtrain/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/common/error.h"
#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

struct RopeCase {
  std::int64_t batch, seq, heads, kv_heads, d;
  double theta;
};

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

// Extracts heads [first, first + n) of a fused row layout into a contiguous [tokens, n * d] array.
Vec slice_heads(const FVec& fused, std::int64_t tokens, std::int64_t stride, std::int64_t col, std::int64_t width) {
  Vec out(static_cast<std::size_t>(tokens * width));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < width; ++j) out[t * width + j] = fused[t * stride + col + j];
  }
  return out;
}

TEST_P(RopeTest, QueriesAndKeysInFusedQkvMatchReference) {
  const auto c = GetParam();
  auto rng = make_rng(300 + c.seq + c.d);
  const std::int64_t tokens = c.batch * c.seq;
  const std::int64_t qw = c.heads * c.d, kw = c.kv_heads * c.d, stride = qw + 2 * kw;
  const FVec qkv = random_floats(rng, tokens * stride);
  FVec cos(c.seq * c.d / 2), sin(c.seq * c.d / 2);
  rope_table(c.theta, c.seq, c.d, cos.data(), sin.data());

  FVec fwd = qkv;
  cpu::rope_forward({c.batch, c.seq, c.heads, c.d, stride}, cos.data(), sin.data(), fwd.data());
  cpu::rope_forward({c.batch, c.seq, c.kv_heads, c.d, stride}, cos.data(), sin.data(), fwd.data() + qw);
  EXPECT_LT(
      ref_error(to_float(slice_heads(fwd, tokens, stride, 0, qw)),
                ref::rope_forward(c.batch, c.seq, c.heads, c.d, c.theta, slice_heads(qkv, tokens, stride, 0, qw))),
      kFp32Tolerance);
  EXPECT_LT(
      ref_error(to_float(slice_heads(fwd, tokens, stride, qw, kw)),
                ref::rope_forward(c.batch, c.seq, c.kv_heads, c.d, c.theta, slice_heads(qkv, tokens, stride, qw, kw))),
      kFp32Tolerance);
  // Values are untouched.
  EXPECT_EQ(slice_heads(fwd, tokens, stride, qw + kw, kw), slice_heads(qkv, tokens, stride, qw + kw, kw));

  FVec bwd = qkv;
  cpu::rope_backward({c.batch, c.seq, c.heads, c.d, stride}, cos.data(), sin.data(), bwd.data());
  cpu::rope_backward({c.batch, c.seq, c.kv_heads, c.d, stride}, cos.data(), sin.data(), bwd.data() + qw);
  EXPECT_LT(
      ref_error(to_float(slice_heads(bwd, tokens, stride, 0, qw)),
                ref::rope_backward(c.batch, c.seq, c.heads, c.d, c.theta, slice_heads(qkv, tokens, stride, 0, qw))),
      kFp32Tolerance);
  EXPECT_LT(
      ref_error(to_float(slice_heads(bwd, tokens, stride, qw, kw)),
                ref::rope_backward(c.batch, c.seq, c.kv_heads, c.d, c.theta, slice_heads(qkv, tokens, stride, qw, kw))),
      kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Values(RopeCase{4, 64, 4, 2, 16, 10000.0},      // tiny model (GQA)
                                           RopeCase{2, 256, 8, 8, 64, 10000.0},     // larger, MHA
                                           RopeCase{1, 4096, 1, 1, 128, 500000.0},  // Llama 3 theta, long sequence
                                           RopeCase{3, 5, 3, 1, 2, 10000.0}));      // odd counts, d = 2

// Scaled tables: cos and sin of each pair's scaled frequency, times yarn's attention factor. The yarn frequencies
// here were computed with transformers' _compute_yarn_parameters formulas in float64 (head 16, theta 1e6, factor 4,
// original context 16, beta_fast 0.01, beta_slow 0.001, not truncated: the ramp runs over dimensions 3.21 to 4.54).
TEST(RopeTest, ScaledTablesFollowHuggingFacesFormulas) {
  RopeScaling yarn;
  yarn.type = RopeScalingType::kYarn;
  yarn.factor = 4;
  yarn.original_context = 16;
  yarn.beta_fast = 0.01;
  yarn.beta_slow = 0.001;
  yarn.truncate = false;
  const double expected[8] = {1.0,
                              0.17782794100389226,
                              0.03162277660168379,
                              0.005623413251903491,
                              0.0005544550857233576,
                              4.445698525097307e-05,
                              7.905694150420949e-06,
                              1.4058533129758728e-06};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(yarn.frequency(i, 16, 1e6), expected[i], 1e-15 * (1 + expected[i])) << i;
  EXPECT_NEAR(yarn.attention_scale(), 1.138629436111989, 1e-15);
  FVec cos(64 * 8), sin(64 * 8);
  rope_table(1e6, 64, 16, cos.data(), sin.data(), yarn);
  for (int p : {0, 1, 37, 63}) {
    for (int i = 0; i < 8; ++i) {
      EXPECT_FLOAT_EQ(cos[p * 8 + i], static_cast<float>(1.138629436111989 * std::cos(p * expected[i])));
      EXPECT_FLOAT_EQ(sin[p * 8 + i], static_cast<float>(1.138629436111989 * std::sin(p * expected[i])));
    }
  }
  RopeScaling linear;
  linear.type = RopeScalingType::kLinear;
  linear.factor = 4;
  rope_table(1e6, 64, 16, cos.data(), sin.data(), linear);
  EXPECT_FLOAT_EQ(cos[37 * 8 + 1], static_cast<float>(std::cos(37 * 0.17782794100389226 / 4)));
}

TEST(RopeTest, TableRejectsOddHeadDim) {
  float c[4], s[4];
  EXPECT_THROW(rope_table(10000.0, 2, 3, c, s), Error);
  EXPECT_THROW(rope_table(0.0, 2, 4, c, s), Error);
}

}  // namespace
}  // namespace dtrain::kernels::testing
