// The kernels' thread pool seen from outside: several callers at once (ranks run as threads of one process, as the
// in-process communication backend does) and changing thread counts all give the single-threaded results bit for bit.
#include <gtest/gtest.h>

#include <thread>

#include "dtrain/kernels/activation.h"
#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/norm.h"
#include "dtrain/kernels/threads.h"
#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

struct Inputs {
  std::int64_t batch = 2, seq = 128, heads = 4, kv = 2, d = 32, rows = 2 * 128, hidden = 512;
  FVec x, gamma, qkv;
};

Inputs make_inputs() {
  Inputs in;
  auto rng = make_rng(1200);
  in.x = random_floats(rng, in.rows * in.hidden);
  in.gamma = random_floats(rng, in.hidden);
  in.qkv = random_floats(rng, in.rows * (in.heads + 2 * in.kv) * in.d);
  return in;
}

// A few ops large enough to be split over threads; returns their outputs.
std::vector<FVec> run_ops(const Inputs& in) {
  FVec y(in.x.size()), rstd(in.rows), g(in.x.size());
  cpu::rmsnorm_forward({in.rows, in.hidden}, in.x.data(), in.gamma.data(), 1e-5f, y.data(), rstd.data());
  cpu::gelu_forward(static_cast<std::int64_t>(in.x.size()), in.x.data(), g.data());
  const std::int64_t w = (in.heads + 2 * in.kv) * in.d;
  const AttentionShape s{in.batch, in.seq, in.heads, in.kv, in.d, w, w};
  FVec o(in.rows * in.heads * in.d), lse(in.batch * in.heads * in.seq);
  const float* q = in.qkv.data();
  cpu::attention_forward(s, q, q + in.heads * in.d, q + (in.heads + in.kv) * in.d, o.data(), lse.data(), nullptr);
  return {y, rstd, g, o, lse};
}

void expect_same(const std::vector<FVec>& a, const std::vector<FVec>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "output " << i;
}

TEST(ThreadPoolTest, ConcurrentCallersMatchSingleThread) {
  const Inputs in = make_inputs();
  std::vector<FVec> expected;
  {
    KernelThreads one(1);
    expected = run_ops(in);
  }
  KernelThreads two(2);
  constexpr int kCallers = 4;
  std::vector<std::vector<FVec>> got(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 20; ++rep) got[c] = run_ops(in);
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) expect_same(got[c], expected);
}

TEST(ThreadPoolTest, ChangingThreadCountKeepsResults) {
  const Inputs in = make_inputs();
  std::vector<FVec> expected;
  {
    KernelThreads one(1);
    expected = run_ops(in);
  }
  for (int n : {2, 3, 8, 2, 1, 5}) {
    KernelThreads threads(n);
    expect_same(run_ops(in), expected);
  }
}

}  // namespace
}  // namespace dtrain::kernels::testing
