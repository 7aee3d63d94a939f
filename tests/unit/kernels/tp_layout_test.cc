// The fused-weight layouts under a column-parallel split: each rank's QKV rows are its heads of Q, K and V, and each
// rank's SwiGLU fc1 rows give it matching gate and up halves.
#include "dtrain/kernels/tp_layout.h"

#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "dtrain/kernels/activation.h"
#include "dtrain/kernels/linear.h"
#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

TEST(TpLayoutTest, QkvRowsOfEachRank) {
  // heads 4, kv_heads 2, d 2: full rows Q 0..7, K 8..11, V 12..15.
  const std::vector<std::int64_t> rank0 = {0, 1, 2, 3, 8, 9, 12, 13};
  const std::vector<std::int64_t> rank1 = {4, 5, 6, 7, 10, 11, 14, 15};
  for (std::int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(qkv_full_row(i, 4, 2, 2, {0, 2}), rank0[i]);
    EXPECT_EQ(qkv_full_row(i, 4, 2, 2, {1, 2}), rank1[i]);
  }
  for (std::int64_t i = 0; i < 16; ++i) EXPECT_EQ(qkv_full_row(i, 4, 2, 2, {0, 1}), i);
  EXPECT_THROW(qkv_full_row(0, 4, 2, 2, {0, 4}), Error);  // kv_heads 2 not divisible by tp 4
  EXPECT_THROW(qkv_full_row(8, 4, 2, 2, {0, 2}), Error);  // past the rank's rows
}

TEST(TpLayoutTest, Fc1RowsOfEachRank) {
  // ffn 6, tp 2, SwiGLU: full rows gate 0..5, up 6..11; rank 1 holds gate 3..5 then up 9..11.
  const std::vector<std::int64_t> rank1 = {3, 4, 5, 9, 10, 11};
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(fc1_full_row(i, 6, true, {1, 2}), rank1[i]);
  for (std::int64_t i = 0; i < 3; ++i) EXPECT_EQ(fc1_full_row(i, 6, false, {1, 2}), 3 + i);
  EXPECT_THROW(fc1_full_row(0, 6, true, {0, 4}), Error);
}

// The whole SwiGLU MLP, fc1 -> swiglu -> fc2, split over 2 simulated ranks with the documented layout: each rank's
// activation equals its slice of the unsharded activation (the gate/up pairing is right), and the row-parallel fc2
// partial sums add up to the unsharded output.
TEST(TpLayoutTest, SwiGluMlpSplitOverTwoRanks) {
  auto rng = make_rng(700);
  const std::int64_t T = 10, h = 8, ffn = 12, tp = 2, f = ffn / tp;
  const FVec x = random_floats(rng, T * h), w1 = random_floats(rng, 2 * ffn * h), w2 = random_floats(rng, h * ffn);
  FVec gu(T * 2 * ffn), act(T * ffn), y(T * h);
  cpu::linear_forward({T, h, 2 * ffn}, x.data(), w1.data(), nullptr, gu.data());
  cpu::swiglu_forward(T, ffn, gu.data(), act.data());
  cpu::linear_forward({T, ffn, h}, act.data(), w2.data(), nullptr, y.data());

  Vec y_sum(T * h, 0.0);
  for (std::int64_t r = 0; r < tp; ++r) {
    FVec w1_r(2 * f * h), w2_r(h * f);
    for (std::int64_t i = 0; i < 2 * f; ++i) {
      const std::int64_t full = fc1_full_row(i, ffn, true, {r, tp});
      std::copy_n(w1.begin() + full * h, h, w1_r.begin() + i * h);
    }
    for (std::int64_t o = 0; o < h; ++o) std::copy_n(w2.begin() + o * ffn + r * f, f, w2_r.begin() + o * f);
    FVec gu_r(T * 2 * f), act_r(T * f), y_r(T * h);
    cpu::linear_forward({T, h, 2 * f}, x.data(), w1_r.data(), nullptr, gu_r.data());
    cpu::swiglu_forward(T, f, gu_r.data(), act_r.data());
    // Equal up to the GEMM's rounding (OpenBLAS blocks a narrower product differently); a wrong gate/up pairing
    // would be off by the size of the values themselves.
    Vec act_slice(T * f);
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t j = 0; j < f; ++j) act_slice[t * f + j] = act[t * ffn + r * f + j];
    }
    EXPECT_LT(rel_error(act_r, act_slice), 1e-6) << "rank " << r;
    cpu::linear_forward({T, f, h}, act_r.data(), w2_r.data(), nullptr, y_r.data());
    for (std::size_t i = 0; i < y_sum.size(); ++i) y_sum[i] += y_r[i];
  }
  EXPECT_LT(rel_error(y, y_sum), 1e-6);
}

}  // namespace
}  // namespace dtrain::kernels::testing
