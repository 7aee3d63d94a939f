// Linear layer against the float64 reference: output, input gradient, accumulated weight and bias gradients.
#include "dtrain/kernels/linear.h"

#include <gtest/gtest.h>

#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

struct LinearCase {
  std::int64_t tokens, in, out;
  bool bias;
};

class LinearTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearTest, MatchesFloat64Reference) {
  const auto c = GetParam();
  auto rng = make_rng(100 + c.tokens * 7 + c.in);
  const FVec x = random_floats(rng, c.tokens * c.in);
  const FVec w = random_floats(rng, c.out * c.in, 0.2);
  const FVec b = c.bias ? random_floats(rng, c.out) : FVec{};
  const FVec dy = random_floats(rng, c.tokens * c.out);
  // Gradient buffers start non-zero: the kernel must accumulate into them.
  const FVec dw0 = random_floats(rng, c.out * c.in);
  const FVec db0 = random_floats(rng, c.out);
  const LinearShape shape{c.tokens, c.in, c.out};

  FVec y(c.tokens * c.out), dx(c.tokens * c.in);
  FVec dw = dw0, db = db0;
  cpu::linear_forward(shape, x.data(), w.data(), c.bias ? b.data() : nullptr, y.data());
  cpu::linear_backward(shape, dy.data(), x.data(), w.data(), dx.data(), dw.data(), c.bias ? db.data() : nullptr);

  const Vec y_ref = ref::linear_forward(c.tokens, c.in, c.out, to_double(x), to_double(w), to_double(b));
  auto g = ref::linear_backward(c.tokens, c.in, c.out, to_double(dy), to_double(x), to_double(w));
  for (std::size_t i = 0; i < g.dw.size(); ++i) g.dw[i] += dw0[i];
  for (std::size_t i = 0; i < g.db.size(); ++i) g.db[i] += db0[i];
  EXPECT_LT(ref_error(y, y_ref), kFp32Tolerance);
  EXPECT_LT(ref_error(dx, g.dx), kFp32Tolerance);
  EXPECT_LT(ref_error(dw, g.dw), kFp32Tolerance);
  if (c.bias) {
    EXPECT_LT(ref_error(db, g.db), kFp32Tolerance);
  } else {
    EXPECT_TRUE(bitwise_equal(db, db0)) << "no bias: the bias gradient must not be touched";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Values(LinearCase{1, 1, 1, true}, LinearCase{7, 13, 5, true},
                                           LinearCase{64, 64, 192, false},  // tiny model's fc1 per token block
                                           LinearCase{33, 96, 50, true}, LinearCase{256, 512, 768, true},
                                           LinearCase{5, 300, 3, false}));

TEST(LinearTest, SplitBackwardEqualsCombined) {
  auto rng = make_rng(131);
  const LinearShape s{9, 17, 11};
  const FVec x = random_floats(rng, 9 * 17), w = random_floats(rng, 11 * 17), dy = random_floats(rng, 9 * 11);
  FVec dx1(9 * 17), dw1(11 * 17, 0.0f), db1(11, 0.0f), dx2 = dx1, dw2 = dw1, db2 = db1;
  cpu::linear_backward(s, dy.data(), x.data(), w.data(), dx1.data(), dw1.data(), db1.data());
  cpu::linear_backward_input(s, dy.data(), w.data(), dx2.data());
  cpu::linear_backward_weight(s, dy.data(), x.data(), dw2.data(), db2.data());
  EXPECT_TRUE(bitwise_equal(dx1, dx2));
  EXPECT_TRUE(bitwise_equal(dw1, dw2));
  EXPECT_TRUE(bitwise_equal(db1, db2));
}

// Megatron's split: a column-parallel layer followed by a row-parallel one over 2 simulated ranks; the sum of the
// row-parallel partial outputs (the all-reduce) equals the unsharded two-layer product.
TEST(LinearTest, ColumnThenRowParallelSumsToUnsharded) {
  auto rng = make_rng(132);
  const std::int64_t T = 6, h = 8, f = 12, tp = 2, fl = f / tp;
  const FVec x = random_floats(rng, T * h), w1 = random_floats(rng, f * h), w2 = random_floats(rng, h * f);
  FVec mid(T * f), y(T * h);
  cpu::linear_forward({T, h, f}, x.data(), w1.data(), nullptr, mid.data());
  cpu::linear_forward({T, f, h}, mid.data(), w2.data(), nullptr, y.data());
  Vec sum(T * h, 0.0);
  for (std::int64_t r = 0; r < tp; ++r) {
    FVec w1_r(w1.begin() + r * fl * h, w1.begin() + (r + 1) * fl * h);  // rows of w1
    FVec w2_r(h * fl);                                                  // columns of w2
    for (std::int64_t o = 0; o < h; ++o) {
      for (std::int64_t i = 0; i < fl; ++i) w2_r[o * fl + i] = w2[o * f + r * fl + i];
    }
    FVec mid_r(T * fl), y_r(T * h);
    cpu::linear_forward({T, h, fl}, x.data(), w1_r.data(), nullptr, mid_r.data());
    cpu::linear_forward({T, fl, h}, mid_r.data(), w2_r.data(), nullptr, y_r.data());
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += y_r[i];
  }
  EXPECT_LT(rel_error(y, sum), 1e-6);
}

}  // namespace
}  // namespace dtrain::kernels::testing
