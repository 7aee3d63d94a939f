// GELU and SwiGLU against the float64 reference.
#include "dtrain/kernels/activation.h"

#include <gtest/gtest.h>

#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

TEST(GeluTest, MatchesFloat64Reference) {
  for (std::int64_t n : {1, 15, 17, 64 * 192, 1024 * 2048 + 3}) {
    auto rng = make_rng(600 + n);
    // stddev 3 covers the saturated tails on both sides as well as the curved middle.
    const FVec x = random_floats(rng, n, 3.0), dy = random_floats(rng, n);
    FVec y(n), dx(n);
    cpu::gelu_forward(n, x.data(), y.data());
    cpu::gelu_backward(n, x.data(), dy.data(), dx.data());
    EXPECT_LT(ref_error(y, ref::gelu_forward(to_double(x))), kFp32Tolerance) << n;
    EXPECT_LT(ref_error(dx, ref::gelu_backward(to_double(x), to_double(dy))), kFp32Tolerance) << n;
  }
}

TEST(GeluTest, ExtremeInputs) {
  const FVec x = {-100.0f, -20.0f, -5.0f, 0.0f, 1e-7f, 5.0f, 20.0f, 100.0f};
  FVec y(x.size());
  cpu::gelu_forward(static_cast<std::int64_t>(x.size()), x.data(), y.data());
  const Vec r = ref::gelu_forward(to_double(x));
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], r[i], 1e-6 * (1 + std::abs(r[i]))) << x[i];
}

TEST(GeluTest, BackwardMayWriteOverTheGradient) {
  auto rng = make_rng(610);
  const FVec x = random_floats(rng, 1000), dy = random_floats(rng, 1000);
  FVec dx(1000), inplace = dy;
  cpu::gelu_backward(1000, x.data(), dy.data(), dx.data());
  cpu::gelu_backward(1000, x.data(), inplace.data(), inplace.data());
  EXPECT_TRUE(bitwise_equal(dx, inplace));
}

TEST(SwiGluTest, MatchesFloat64Reference) {
  for (auto [tokens, ffn] : {std::pair<std::int64_t, std::int64_t>{256, 192}, {1024, 1376}, {3, 7}, {1, 1}}) {
    auto rng = make_rng(620 + tokens + ffn);
    const FVec gu = random_floats(rng, tokens * 2 * ffn, 3.0), dy = random_floats(rng, tokens * ffn);
    FVec y(tokens * ffn), dgu(gu.size());
    cpu::swiglu_forward(tokens, ffn, gu.data(), y.data());
    cpu::swiglu_backward(tokens, ffn, gu.data(), dy.data(), dgu.data());
    EXPECT_LT(ref_error(y, ref::swiglu_forward(tokens, ffn, to_double(gu))), kFp32Tolerance);
    EXPECT_LT(ref_error(dgu, ref::swiglu_backward(tokens, ffn, to_double(gu), to_double(dy))), kFp32Tolerance);
  }
}

}  // namespace
}  // namespace dtrain::kernels::testing
