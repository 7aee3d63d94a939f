// The executor's device backend: Buffer's value semantics (the interpreter relies on them as it did on std::vector's)
// and the CPU backend's element-wise work and reductions, whose order the bit-for-bit parity tests depend on.
#include "dtrain/exec/backend.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace dtrain::exec
