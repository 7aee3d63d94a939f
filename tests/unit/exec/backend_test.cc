// The executor's device backend: Buffer's value semantics (the interpreter relies on them as it did on std::vector's)
// and the CPU backend's element-wise work and reductions, whose order the bit-for-bit parity tests depend on.
#include "dtrain/exec/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace dtrain::exec {
namespace {

std::vector<float> host(const Buffer<float>& b) {
  std::vector<float> v(b.size());
  b.backend()->copy_to_host(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

Buffer<float> device(const std::vector<float>& v) {
  Buffer<float> b(cpu_backend(), v.size());
  cpu_backend().copy_to_backend(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

TEST(Buffer, NewElementsAreZeroAndFillSetsEvery) {
  Buffer<float> z(cpu_backend(), 3);
  EXPECT_EQ(host(z), (std::vector<float>{0, 0, 0}));
  Buffer<float> f(cpu_backend(), 2, 0.25f);
  EXPECT_EQ(host(f), (std::vector<float>{0.25f, 0.25f}));
}

TEST(Buffer, CopyIsDeepAndMoveLeavesEmpty) {
  Buffer<float> a = device({1, 2, 3});
  Buffer<float> b = a;
  ASSERT_NE(a.data(), b.data());
  cpu_backend().fill(1, 9.0f, b.data());
  EXPECT_EQ(host(a), (std::vector<float>{1, 2, 3}));
  Buffer<float> c = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is part of the contract
  EXPECT_EQ(host(c), (std::vector<float>{1, 2, 3}));
}

TEST(Buffer, DefaultTakesTheBackendOfWhatIsAssignedAndResizeKeepsTheFront) {
  Buffer<float> d;
  EXPECT_EQ(d.backend(), nullptr);
  d = device({4, 5});
  EXPECT_EQ(d.backend(), &cpu_backend());
  d.resize(4);
  EXPECT_EQ(host(d), (std::vector<float>{4, 5, 0, 0}));
  d.resize(1);
  EXPECT_EQ(host(d), (std::vector<float>{4}));
  d.clear();
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(d.backend(), &cpu_backend());
}

TEST(CpuBackend, MemoryUseFollowsAllocationsAndKeepsThePeak) {
  Backend& be = cpu_backend();
  const Backend::MemoryUse before = be.memory_use();
  EXPECT_GE(before.peak, before.in_use);
  {
    Buffer<float> a(be, 1 << 20);
    const Backend::MemoryUse during = be.memory_use();
    EXPECT_EQ(during.in_use, before.in_use + (4 << 20));
    EXPECT_GE(during.peak, during.in_use);
  }
  const Backend::MemoryUse after = be.memory_use();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_GE(after.peak, before.in_use + (4 << 20));
}

TEST(CpuBackend, BiasAddAndBiasGradientRunOverRows) {
  Kernels<float>& be = cpu_backend().kernels<float>();
  Buffer<float> x = device({1, 2, 3, 4, 5, 6});  // [2 rows, 3 cols]
  Buffer<float> bias = device({10, 20, 30});
  be.add_bias_rows(2, 3, bias.data(), x.data());
  EXPECT_EQ(host(x), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  Buffer<float> db = device({1, 1, 1});
  be.accumulate_bias_grad(2, 3, x.data(), db.data());
  EXPECT_EQ(host(db), (std::vector<float>{26, 48, 70}));
}

TEST(CpuBackend, SumsAccumulateInFloat64InOrder) {
  Backend& be = cpu_backend();
  // 2^24 + 1 + 1 is exact in float64 and not in float32: the accumulator is a double.
  Buffer<float> x = device({16777216.0f, 1.0f, 1.0f});
  EXPECT_EQ(be.sum(3, x.data()), 16777218.0);
  Buffer<float> y = device({3, 4});
  EXPECT_EQ(be.sum_squares({{x.data() + 1, 2}, {y.data(), 2}}), 1.0 + 1.0 + 9.0 + 16.0);
  EXPECT_EQ(be.sum_squares({}), 0.0);
}

TEST(CpuBackend, RunsFp32AndBf16ActivationsOnly) {
  Backend& be = cpu_backend();
  EXPECT_TRUE(be.supports(DType::kFp32));
  EXPECT_TRUE(be.supports(DType::kBf16));
  EXPECT_FALSE(be.supports(DType::kFp16));
  EXPECT_FALSE(be.supports(DType::kFp8));
}

// bf16 values chosen so that every product and sum below is exact in fp32 but not in bf16.
std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out;
  for (float x : v) out.push_back(dtrain::to_bf16(x));
  return out;
}

TEST(CpuBf16Kernels, LinearRoundsTheFp32ResultOnce) {
  Kernels<bf16>& k = cpu_backend().kernels<bf16>();
  // x [1, 2] = (1, 1), W [1, 2] = (1, 2^-8), bias 2^-8: summed in fp32, 1 + 2^-8 + 2^-8 = 1 + 2^-7, a bf16 value.
  // Rounding each partial sum to bf16 (spacing 2^-7 above 1, ties to even) would give 1 + 2^-8 -> 1, then 1 again.
  std::vector<bf16> x = to_bf16({1, 1}), w = to_bf16({1, 0x1p-8f}), b = to_bf16({0x1p-8f}), y(1);
  k.linear_forward({1, 2, 1}, x.data(), w.data(), b.data(), y.data());
  EXPECT_EQ(dtrain::from_bf16(y[0]), 1.0f + 0x1p-7f);
  // And the output is rounded: 1 + 2^-9 + 2^-10 (exact in fp32) is not a bf16 value; the nearest one is 1.
  w = to_bf16({1, 0x1p-9f});
  b = to_bf16({0x1p-10f});
  k.linear_forward({1, 2, 1}, x.data(), w.data(), b.data(), y.data());
  EXPECT_EQ(dtrain::from_bf16(y[0]), 1.0f);
}

TEST(CpuBf16Kernels, RopeInsideTheFusedQkvTouchesOnlyItsHeads) {
  Kernels<bf16>& k = cpu_backend().kernels<bf16>();
  // One token row of [q (2 heads of 2) | k (1 head) | v (1 head)] = 8 values, 2 tokens, stride 8.
  std::vector<bf16> qkv = to_bf16({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  std::vector<bf16> before = qkv;
  std::vector<float> cos = {1, 0}, sin = {0, 1};  // position 0: identity; position 1: a quarter turn
  k.rope_forward({1, 2, 1, 2, 8}, cos.data(), sin.data(), qkv.data() + 4);  // the key head
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 15}) EXPECT_EQ(qkv[i], before[i]) << i;
  // token 1's key (13, 14) rotated by 90 degrees: (-14, 13)
  EXPECT_EQ(dtrain::from_bf16(qkv[12]), -14.0f);
  EXPECT_EQ(dtrain::from_bf16(qkv[13]), 13.0f);
}

TEST(CpuBf16Kernels, AttentionBackwardFillsEachPartOfTheFusedGradient) {
  Kernels<bf16>& k = cpu_backend().kernels<bf16>();
  Kernels<float>& f = cpu_backend().kernels<float>();
  // 1 sequence of 3 tokens, 2 query heads, 1 kv head, head_dim 2: rows of 8 = q(4) | k(2) | v(2).
  const kernels::AttentionShape shape{1, 3, 2, 1, 2, 8, 8};
  std::vector<float> qkv(24), dout(12);
  for (int i = 0; i < 24; ++i) qkv[i] = dtrain::round_to_bf16(0.25f * static_cast<float>((i * 7) % 11) - 1.0f);
  for (int i = 0; i < 12; ++i) dout[i] = dtrain::round_to_bf16(0.5f - 0.125f * static_cast<float>(i % 5));
  // fp32 reference on the same (bf16-representable) inputs
  std::vector<float> o(12), lse(6), dqkv(24, 0.0f);
  f.attention_forward(shape, qkv.data(), qkv.data() + 4, qkv.data() + 6, o.data(), lse.data(), nullptr);
  for (float& x : o) x = dtrain::round_to_bf16(x);  // the backward reads the stored (bf16) output
  f.attention_backward(shape, qkv.data(), qkv.data() + 4, qkv.data() + 6, o.data(), lse.data(), dout.data(),
                       dqkv.data(), dqkv.data() + 4, dqkv.data() + 6, nullptr);
  std::vector<bf16> bq = to_bf16(qkv), bo = to_bf16(o), bd = to_bf16(dout);
  std::vector<bf16> bdqkv(24, dtrain::to_bf16(std::nanf("")));  // poisoned: every element must be written
  k.attention_backward(shape, bq.data(), bq.data() + 4, bq.data() + 6, bo.data(), lse.data(), bd.data(), bdqkv.data(),
                       bdqkv.data() + 4, bdqkv.data() + 6, nullptr);
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(dtrain::from_bf16(bdqkv[i]), dtrain::round_to_bf16(dqkv[i])) << "element " << i;
  }
}

}  // namespace
}  // namespace dtrain::exec
