// The mixture-of-experts kernels on the GPU against the CPU kernels (dtrain/kernels/moe.h), bf16 activations rounded
// once and given to both.
#include "dtrain/kernels/cuda/moe.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "dtrain/kernels/cuda/grouped_linear.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/moe.h"
#include "support.h"

namespace dtrain::kernels::cuda::testing {
namespace {

using MoeTest = CudaTest;

TEST_F(MoeTest, RouteAndItsBackwardMatchTheCpu) {
  auto rng = make_rng(61);
  for (bool normalize : {true, false}) {
    const MoeRouteShape s{300, 8, 2, normalize};
    const std::int64_t seq = 100;
    const FVec logits = random_bf16_values(rng, s.tokens * s.experts, 2.0);
    const FVec dgate = random_floats(rng, s.tokens * s.top_k), aux = random_floats(rng, 3 * s.experts);
    FVec probs(logits.size()), gate(s.tokens * s.top_k), dlogits(logits.size());
    IVec expert(gate.size());
    cpu::moe_route(s, logits.data(), probs.data(), expert.data(), gate.data());
    cpu::moe_route_backward(s, probs.data(), expert.data(), dgate.data(), aux.data(), seq, dlogits.data());

    const auto d_logits = to_device_bf16(ctx(), logits);
    auto d_probs = poisoned<float>(ctx(), probs.size());
    auto d_gate = poisoned<float>(ctx(), gate.size());
    auto d_expert = poisoned<std::int32_t>(ctx(), expert.size());
    moe_route(ctx(), s, d_logits.data(), d_probs.data(), d_expert.data(), d_gate.data());
    EXPECT_EQ(to_host(ctx(), d_expert), expert);
    EXPECT_LT(rel_error(to_host(ctx(), d_probs), probs), kFp32Tolerance);
    EXPECT_LT(rel_error(to_host(ctx(), d_gate), gate), kFp32Tolerance);

    // The backward from the CPU's probabilities and choices, so that only its own arithmetic is compared.
    const auto dp = to_device(ctx(), probs);
    const auto de = to_device(ctx(), expert);
    const auto dg = to_device(ctx(), dgate);
    const auto da = to_device(ctx(), aux);
    auto d_dlogits = poisoned<bf16>(ctx(), dlogits.size());
    moe_route_backward(ctx(), s, dp.data(), de.data(), dg.data(), da.data(), seq, d_dlogits.data());
    EXPECT_LT(rel_error(to_host_float(ctx(), d_dlogits), dlogits), kBf16Tolerance);
  }
}

TEST_F(MoeTest, PermutationsMatchTheCpu) {
  auto rng = make_rng(62);
  const std::int64_t T = 200, K = 2, cols = 72, E = 4;
  // Random choices, grouped by expert in token order, every fifth second choice dropped.
  std::uniform_int_distribution<int> pick(0, E - 1);
  IVec slot(T * K, -1), rows;
  std::vector<std::vector<std::int32_t>> by_expert(E);
  std::vector<std::pair<std::int64_t, int>> choice(T * K);
  for (std::int64_t t = 0; t < T; ++t) {
    const int a = pick(rng), b = (a + 1 + pick(rng) % (E - 1)) % E;
    choice[t * K] = {t, a};
    choice[t * K + 1] = {t, b};
  }
  for (int e = 0; e < E; ++e) {
    for (std::int64_t i = 0; i < T * K; ++i) {
      if (choice[i].second != e || (i % K == 1 && choice[i].first % 5 == 0)) continue;
      slot[i] = static_cast<std::int32_t>(rows.size());
      rows.push_back(static_cast<std::int32_t>(choice[i].first));
    }
  }
  const auto N = static_cast<std::int64_t>(rows.size());
  const FVec x = random_bf16_values(rng, T * cols), gate = random_floats(rng, T * K);
  const FVec dout = random_bf16_values(rng, T * cols), base = random_bf16_values(rng, T * cols);
  FVec xe(N * cols), out(T * cols), acc = base, dxe(N * cols), dgate(T * K);
  cpu::moe_gather_rows(N, cols, x.data(), rows.data(), xe.data());
  cpu::moe_unpermute(T, K, cols, xe.data(), slot.data(), gate.data(), false, out.data());
  cpu::moe_unpermute(T, K, cols, xe.data(), slot.data(), nullptr, true, acc.data());
  cpu::moe_unpermute_backward(T, K, cols, dout.data(), xe.data(), slot.data(), gate.data(), dxe.data(), dgate.data());

  const auto d_x = to_device_bf16(ctx(), x);
  const auto d_rows = to_device(ctx(), rows), d_slot = to_device(ctx(), slot);
  const auto d_gate = to_device(ctx(), gate);
  auto d_xe = poisoned<bf16>(ctx(), xe.size());
  moe_gather_rows(ctx(), N, cols, d_x.data(), d_rows.data(), d_xe.data());
  EXPECT_EQ(to_host_float(ctx(), d_xe), xe);  // a copy: exact
  auto d_out = poisoned<bf16>(ctx(), out.size());
  moe_unpermute(ctx(), T, K, cols, d_xe.data(), d_slot.data(), d_gate.data(), false, d_out.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), d_out), out), kBf16Tolerance);
  auto d_acc = to_device_bf16(ctx(), base);
  moe_unpermute(ctx(), T, K, cols, d_xe.data(), d_slot.data(), nullptr, true, d_acc.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), d_acc), acc), kBf16Tolerance);
  const auto d_dout = to_device_bf16(ctx(), dout);
  auto d_dxe = poisoned<bf16>(ctx(), dxe.size());
  auto d_dgate = poisoned<float>(ctx(), dgate.size());
  moe_unpermute_backward(ctx(), T, K, cols, d_dout.data(), d_xe.data(), d_slot.data(), d_gate.data(), d_dxe.data(),
                         d_dgate.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), d_dxe), dxe), kBf16Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), d_dgate), dgate), kFp32Tolerance);
}

// The experts' grouped GEMMs against the CPU's linear layers group by group: uneven rows, an empty group, the weight
// gradient accumulated onto what the buffers held.
TEST_F(MoeTest, GroupedLinearMatchesTheCpuGroupByGroup) {
  auto rng = make_rng(63);
  const std::int64_t in = 96, out = 80;
  const std::vector<std::int64_t> rows = {37, 0, 64, 5};
  std::int64_t total = 0;
  for (auto r : rows) total += r;
  const auto groups = static_cast<std::int64_t>(rows.size());
  const FVec x = random_bf16_values(rng, total * in), dy = random_bf16_values(rng, total * out);
  std::vector<FVec> w, dw0;
  for (std::int64_t g = 0; g < groups; ++g) {
    w.push_back(random_bf16_values(rng, out * in, 0.1));
    dw0.push_back(random_floats(rng, out * in));
  }
  FVec y(total * out), dx(total * in);
  std::vector<FVec> dw = dw0;
  for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
    if (rows[g] == 0) continue;
    const LinearShape s{rows[g], in, out};
    cpu::linear_forward(s, x.data() + r * in, w[g].data(), nullptr, y.data() + r * out);
    cpu::linear_backward_input(s, dy.data() + r * out, w[g].data(), dx.data() + r * in);
    cpu::linear_backward_weight(s, dy.data() + r * out, x.data() + r * in, dw[g].data(), nullptr);
  }
  const auto d_x = to_device_bf16(ctx(), x), d_dy = to_device_bf16(ctx(), dy);
  std::vector<DeviceBuffer<bf16>> d_w;
  std::vector<DeviceBuffer<float>> d_dw;
  std::vector<const bf16*> wp;
  std::vector<float*> dwp;
  for (std::int64_t g = 0; g < groups; ++g) {
    d_w.push_back(to_device_bf16(ctx(), w[g]));
    d_dw.push_back(to_device(ctx(), dw0[g]));
    wp.push_back(d_w.back().data());
    dwp.push_back(d_dw.back().data());
  }
  auto d_y = poisoned<bf16>(ctx(), y.size());
  auto d_dx = poisoned<bf16>(ctx(), dx.size());
  grouped_linear_forward(ctx(), groups, rows.data(), in, out, d_x.data(), wp.data(), d_y.data());
  grouped_linear_backward_input(ctx(), groups, rows.data(), in, out, d_dy.data(), wp.data(), d_dx.data());
  grouped_linear_backward_weight(ctx(), groups, rows.data(), in, out, d_dy.data(), d_x.data(), dwp.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), d_y), y), kBf16Tolerance);
  EXPECT_LT(rel_error(to_host_float(ctx(), d_dx), dx), kBf16Tolerance);
  for (std::int64_t g = 0; g < groups; ++g) {
    EXPECT_LT(rel_error(to_host(ctx(), d_dw[g]), dw[g]), kFp32Tolerance) << "group " << g;
  }
  // Which way it ran (cuBLAS's grouped kernel, or group by group where it has none for these types).
  std::printf("grouped GEMM calls run group by group: %lld of 3\n",
              static_cast<long long>(grouped_linear_fallbacks(ctx())));
}

}  // namespace
}  // namespace dtrain::kernels::cuda::testing
