// AdamW, gradient norm and clipping, learning-rate schedule.
#include "dtrain/kernels/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/common/error.h"
#include "dtrain/kernels/lr_schedule.h"
#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

// Three buffers (a decayed matrix, a bias and a norm weight without decay, one of odd length), five steps with a
// changing learning rate and a clip coefficient, against the float64 reference.
TEST(AdamWTest, FiveStepsMatchFloat64Reference) {
  auto rng = make_rng(1000);
  const std::vector<std::int64_t> sizes = {64 * 192, 17, 64};
  const std::vector<bool> decay = {true, false, false};
  std::vector<FVec> param, m, v;
  std::vector<ref::AdamWState> refs;
  for (std::int64_t n : sizes) {
    param.push_back(random_floats(rng, n, 0.5));
    m.emplace_back(n, 0.0f);
    v.emplace_back(n, 0.0f);
    refs.push_back({to_double(param.back()), Vec(n, 0.0), Vec(n, 0.0)});
  }
  const LrSchedule sched{3e-3, 3e-4, 2, 10};
  for (std::int64_t step = 1; step <= 5; ++step) {
    std::vector<FVec> grads;
    std::vector<AdamWBuffer> bufs;
    for (std::size_t i = 0; i < sizes.size(); ++i) grads.push_back(random_floats(rng, sizes[i], 0.1));
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      bufs.push_back({param[i].data(), grads[i].data(), m[i].data(), v[i].data(), sizes[i], decay[i]});
    }
    const double lr = learning_rate(sched, step - 1);
    const double grad_scale = step == 3 ? 0.25 : 1.0;  // a clipped step
    cpu::adamw_step({lr, 0.9, 0.95, 1e-8, 0.1, step, grad_scale}, bufs.data(), static_cast<std::int64_t>(bufs.size()));
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ref::adamw_step(refs[i], to_double(grads[i]), lr, 0.9, 0.95, 1e-8, 0.1, decay[i], step, grad_scale);
    }
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_LT(ref_error(param[i], refs[i].param), kFp32Tolerance) << "buffer " << i;
    EXPECT_LT(ref_error(m[i], refs[i].m), kFp32Tolerance) << "buffer " << i;
    EXPECT_LT(ref_error(v[i], refs[i].v), kFp32Tolerance) << "buffer " << i;
  }
}

// The CUDA kernel gives the CPU's bits (tests/unit/kernels_cuda/optimizer_test.cc) only if neither fuses a multiply
// and an add: each operation of the formula is rounded on its own. The reference rounds each one explicitly: the
// float64 result of one float operation, rounded to float, is the correctly rounded float result (53 >= 2 * 24 + 2),
// and a rounding between the operations leaves the compiler nothing to fuse. The kernel's vector clones (AVX2,
// AVX-512: FMA available) are the ones this catches.
TEST(AdamWTest, EachOperationIsRoundedOnItsOwn) {
  const auto mul = [](float a, float b) { return static_cast<float>(static_cast<double>(a) * b); };
  const auto add = [](float a, float b) { return static_cast<float>(static_cast<double>(a) + b); };
  const auto sub = [](float a, float b) { return static_cast<float>(static_cast<double>(a) - b); };
  const auto div = [](float a, float b) { return static_cast<float>(static_cast<double>(a) / b); };
  const auto sqrt = [](float a) { return static_cast<float>(std::sqrt(static_cast<double>(a))); };
  auto rng = make_rng(1001);
  constexpr std::int64_t kSize = 10007;  // vector bodies and a scalar tail
  FVec param = random_floats(rng, kSize), m(kSize, 0.0f), v(kSize, 0.0f);
  FVec ref_param = param, ref_m = m, ref_v = v;
  for (std::int64_t step = 1; step <= 4; ++step) {
    const FVec grad = random_floats(rng, kSize, 0.01);
    const bool decay = step != 2;
    const AdamWConfig cfg{1e-3 * static_cast<double>(step), 0.9, 0.95, 1e-8, 0.1, step, step == 3 ? 0.25 : 1.0};
    const AdamWBuffer buf{param.data(), grad.data(), m.data(), v.data(), kSize, decay};
    cpu::adamw_step(cfg, &buf, 1);
    // The scalars as optimizer.h defines them: float64, rounded to float once.
    const double t = static_cast<double>(step);
    const auto decay_factor = static_cast<float>(1.0 - cfg.lr * cfg.weight_decay);
    const auto beta1 = static_cast<float>(cfg.beta1), one_minus_beta1 = static_cast<float>(1.0 - cfg.beta1);
    const auto beta2 = static_cast<float>(cfg.beta2), one_minus_beta2 = static_cast<float>(1.0 - cfg.beta2);
    const auto step_size = static_cast<float>(cfg.lr / (1.0 - std::pow(cfg.beta1, t)));
    const auto bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t)));
    const auto eps = static_cast<float>(cfg.eps), grad_scale = static_cast<float>(cfg.grad_scale);
    for (std::size_t i = 0; i < grad.size(); ++i) {
      const float g = mul(grad[i], grad_scale);
      const float p = decay ? mul(ref_param[i], decay_factor) : ref_param[i];
      ref_m[i] = add(mul(ref_m[i], beta1), mul(g, one_minus_beta1));
      ref_v[i] = add(mul(ref_v[i], beta2), mul(mul(one_minus_beta2, g), g));
      const float denom = add(div(sqrt(ref_v[i]), bias_correction2_sqrt), eps);
      ref_param[i] = sub(p, mul(step_size, div(ref_m[i], denom)));
    }
    ASSERT_TRUE(bitwise_equal(m, ref_m)) << "m after step " << step;
    ASSERT_TRUE(bitwise_equal(v, ref_v)) << "v after step " << step;
    ASSERT_TRUE(bitwise_equal(param, ref_param)) << "param after step " << step;
  }
}

TEST(AdamWTest, NoDecayBufferIgnoresWeightDecay) {
  FVec p1 = {1.0f, -2.0f}, p2 = p1, g = {0.5f, 0.5f}, m1(2, 0.0f), v1(2, 0.0f), m2 = m1, v2 = v1;
  AdamWBuffer a{p1.data(), g.data(), m1.data(), v1.data(), 2, false};
  AdamWBuffer b{p2.data(), g.data(), m2.data(), v2.data(), 2, false};
  cpu::adamw_step({1e-2, 0.9, 0.95, 1e-8, 0.5, 1, 1.0}, &a, 1);
  cpu::adamw_step({1e-2, 0.9, 0.95, 1e-8, 0.0, 1, 1.0}, &b, 1);
  EXPECT_TRUE(bitwise_equal(p1, p2));
  // First step: m_hat = g, v_hat = g^2, so the update is lr * sign(g) (up to eps).
  EXPECT_NEAR(p1[0], 1.0 - 1e-2, 1e-7);
}

TEST(GradNormTest, SumOfSquaresAndClipCoefficient) {
  auto rng = make_rng(1010);
  const FVec a = random_floats(rng, 100003), b = random_floats(rng, 5);
  double expected = 0;
  for (float x : a) expected += static_cast<double>(x) * x;
  for (float x : b) expected += static_cast<double>(x) * x;
  const GradBuffer bufs[] = {{a.data(), 100003}, {b.data(), 5}};
  const double got = cpu::grad_norm_squared(bufs, 2);
  EXPECT_NEAR(got, expected, 1e-12 * expected);
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(4.0, 0.0), 1.0);  // clipping off
  EXPECT_EQ(cpu::grad_norm_squared(bufs, 0), 0.0);
}

TEST(GradNormTest, ScaleMultiplies) {
  FVec x = {1, -2, 4};
  cpu::scale(3, 0.5f, x.data());
  EXPECT_EQ(x, (FVec{0.5f, -1.0f, 2.0f}));
}

TEST(LrScheduleTest, WarmupThenCosineToMinLr) {
  const LrSchedule s{1e-3, 1e-4, 10, 100};
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 1e-4);  // lr * 1/10
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 9), 1e-3);                  // peak at the end of warmup
  EXPECT_DOUBLE_EQ(learning_rate(s, 10), 1e-3);                 // cosine starts at the peak
  EXPECT_NEAR(learning_rate(s, 55), 1e-4 + 0.5 * 9e-4, 1e-15);  // half way: cos(pi/2) = 0
  EXPECT_NEAR(learning_rate(s, 99), 1e-4 + 0.5 * 9e-4 * (1 + std::cos(M_PI * 89.0 / 90.0)), 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(s, 100), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 100000), 1e-4);
  for (std::int64_t step = 10; step < 100; ++step) EXPECT_LE(learning_rate(s, step + 1), learning_rate(s, step));
}

TEST(LrScheduleTest, NoWarmupAndValidation) {
  EXPECT_DOUBLE_EQ(learning_rate({2e-3, 0.0, 0, 50}, 0), 2e-3);
  EXPECT_DOUBLE_EQ(learning_rate({2e-3, 0.0, 0, 0}, 0), 0.0);  // decay_steps 0: min_lr from the start
  EXPECT_THROW(validate(LrSchedule{1e-3, 1e-4, 10, 5}), Error);
  EXPECT_THROW(validate(LrSchedule{1e-4, 1e-3, 0, 5}), Error);
  EXPECT_THROW(learning_rate({1e-3, 1e-4, 10, 100}, -1), Error);
  EXPECT_NO_THROW(validate(LrSchedule{1e-3, 1e-4, 10, 100}));
}

}  // namespace
}  // namespace dtrain::kernels::testing
