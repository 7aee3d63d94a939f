// AdamW, gradient norm and scale on the GPU against the CPU backend. AdamW's operations are rounded one by one on both
// sides in the same order (optimizer.h), so the results must be the same bits.
#include "dtrain/kernels/cuda/optimizer.h"

#include <gtest/gtest.h>

#include "dtrain/kernels/optimizer.h"
#include "support.h"

namespace dtrain::kernels::cuda::testing {
namespace {

using OptimizerTest = CudaTest;

TEST_F(OptimizerTest, AdamWMatchesCpuBitwiseOverSteps) {
  auto rng = make_rng(101);
  const std::int64_t sizes[] = {1000, 17, 5000, 1};
  constexpr int kBuffers = 4;
  FVec param[kBuffers], grad[kBuffers], m[kBuffers], v[kBuffers];
  DeviceBuffer<float> dparam[kBuffers], dgrad[kBuffers], dm[kBuffers], dv[kBuffers];
  AdamWBuffer cpu_buf[kBuffers], gpu_buf[kBuffers];
  for (int b = 0; b < kBuffers; ++b) {
    param[b] = random_floats(rng, sizes[b]);
    grad[b] = random_floats(rng, sizes[b], 0.01);
    m[b] = FVec(sizes[b], 0.0f);
    v[b] = FVec(sizes[b], 0.0f);
    dparam[b] = to_device(ctx(), param[b]);
    dgrad[b] = to_device(ctx(), grad[b]);
    dm[b] = to_device(ctx(), m[b]);
    dv[b] = to_device(ctx(), v[b]);
    const bool decay = b != 1;  // a "norm weight" without decay
    cpu_buf[b] = AdamWBuffer{param[b].data(), grad[b].data(), m[b].data(), v[b].data(), sizes[b], decay};
    gpu_buf[b] = AdamWBuffer{dparam[b].data(), dgrad[b].data(), dm[b].data(), dv[b].data(), sizes[b], decay};
  }
  for (std::int64_t step = 1; step <= 3; ++step) {
    const AdamWConfig cfg{3e-4, 0.9, 0.95, 1e-8, 0.1, step, 0.7};
    cpu::adamw_step(cfg, cpu_buf, kBuffers);
    adamw_step(ctx(), cfg, gpu_buf, kBuffers);
  }
  for (int b = 0; b < kBuffers; ++b) {
    EXPECT_EQ(to_host(ctx(), dparam[b]), param[b]) << "buffer " << b;
    EXPECT_EQ(to_host(ctx(), dm[b]), m[b]) << "buffer " << b;
    EXPECT_EQ(to_host(ctx(), dv[b]), v[b]) << "buffer " << b;
  }
}

TEST_F(OptimizerTest, AdamWOverMoreBuffersThanOneLaunchHolds) {
  constexpr int kBuffers = 40;  // two launches of up to 32 buffers
  auto rng = make_rng(102);
  FVec param[kBuffers], grad[kBuffers], m[kBuffers], v[kBuffers];
  DeviceBuffer<float> dparam[kBuffers], dgrad[kBuffers], dm[kBuffers], dv[kBuffers];
  AdamWBuffer cpu_buf[kBuffers], gpu_buf[kBuffers];
  for (int b = 0; b < kBuffers; ++b) {
    const std::int64_t n = 50 + b;
    param[b] = random_floats(rng, n);
    grad[b] = random_floats(rng, n);
    m[b] = random_floats(rng, n, 0.1);
    v[b] = FVec(n, 0.01f);
    dparam[b] = to_device(ctx(), param[b]);
    dgrad[b] = to_device(ctx(), grad[b]);
    dm[b] = to_device(ctx(), m[b]);
    dv[b] = to_device(ctx(), v[b]);
    cpu_buf[b] = AdamWBuffer{param[b].data(), grad[b].data(), m[b].data(), v[b].data(), n, true};
    gpu_buf[b] = AdamWBuffer{dparam[b].data(), dgrad[b].data(), dm[b].data(), dv[b].data(), n, true};
  }
  const AdamWConfig cfg{1e-3, 0.9, 0.999, 1e-8, 0.01, 5, 1.0};
  cpu::adamw_step(cfg, cpu_buf, kBuffers);
  adamw_step(ctx(), cfg, gpu_buf, kBuffers);
  for (int b = 0; b < kBuffers; ++b) EXPECT_EQ(to_host(ctx(), dparam[b]), param[b]) << "buffer " << b;
}

TEST_F(OptimizerTest, GradNormAndScale) {
  auto rng = make_rng(103);
  const FVec a = random_floats(rng, 10000), b = random_floats(rng, 3), c = random_floats(rng, 4096);
  const GradBuffer cpu_list[] = {{a.data(), 10000}, {b.data(), 3}, {nullptr, 0}, {c.data(), 4096}};
  const double expect = cpu::grad_norm_squared(cpu_list, 4);
  const auto da = to_device(ctx(), a), db = to_device(ctx(), b), dc = to_device(ctx(), c);
  const GradBuffer gpu_list[] = {{da.data(), 10000}, {db.data(), 3}, {nullptr, 0}, {dc.data(), 4096}};
  auto result = poisoned<double>(ctx(), 1);
  grad_norm_squared(ctx(), gpu_list, 4, result.data());
  EXPECT_NEAR(to_host(ctx(), result)[0], expect, 1e-12 * expect);  // float64 sums in two different trees
  grad_norm_squared(ctx(), gpu_list, 0, result.data());
  EXPECT_EQ(to_host(ctx(), result)[0], 0.0);

  FVec x = a;
  cpu::scale(static_cast<std::int64_t>(x.size()), 0.37f, x.data());
  auto dx = to_device(ctx(), a);
  scale(ctx(), static_cast<std::int64_t>(a.size()), 0.37f, dx.data());
  EXPECT_EQ(to_host(ctx(), dx), x);
}

}  // namespace
}  // namespace dtrain::kernels::cuda::testing
