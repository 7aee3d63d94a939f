// The mixture-of-experts kernels (dtrain/kernels/moe.h): the router against a float64 reference, its backward and
// the permutations' against finite differences of a scalar function of their outputs.
#include "dtrain/kernels/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace dtrain::kernels {
namespace {

using Vec = std::vector<float>;

Vec random_vec(std::mt19937_64& rng, std::size_t n, double stddev = 1.0) {
  std::normal_distribution<double> dist(0.0, stddev);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(dist(rng));
  return v;
}

// Softmax and top-k in float64 for one token.
void reference_route(const MoeRouteShape& s, const float* logits, std::vector<double>& probs, std::vector<int>& top,
                     std::vector<double>& gate) {
  probs.assign(static_cast<std::size_t>(s.experts), 0);
  double max = *std::max_element(logits, logits + s.experts), sum = 0;
  for (std::int64_t e = 0; e < s.experts; ++e) sum += probs[e] = std::exp(static_cast<double>(logits[e]) - max);
  for (auto& p : probs) p /= sum;
  std::vector<int> order(static_cast<std::size_t>(s.experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
  top.assign(order.begin(), order.begin() + s.top_k);
  double chosen = 0;
  gate.clear();
  for (int e : top) {
    gate.push_back(probs[e]);
    chosen += probs[e];
  }
  if (s.normalize) {
    for (auto& g : gate) g /= chosen;
  }
}

TEST(MoeKernels, RouteIsSoftmaxAndTopK) {
  std::mt19937_64 rng(11);
  for (bool normalize : {true, false}) {
    const MoeRouteShape s{37, 8, 3, normalize};
    Vec logits = random_vec(rng, 37 * 8, 2.0);
    logits[5 * 8 + 2] = logits[5 * 8 + 6] = 9.0f;  // a tie: the lower index first
    Vec probs(37 * 8), gate(37 * 3);
    std::vector<std::int32_t> expert(37 * 3);
    cpu::moe_route(s, logits.data(), probs.data(), expert.data(), gate.data());
    for (std::int64_t t = 0; t < s.tokens; ++t) {
      std::vector<double> p, g;
      std::vector<int> top;
      reference_route(s, logits.data() + t * 8, p, top, g);
      for (int e = 0; e < 8; ++e) EXPECT_NEAR(probs[t * 8 + e], p[e], 1e-6);
      for (int j = 0; j < 3; ++j) {
        EXPECT_EQ(expert[t * 3 + j], top[j]) << "token " << t;
        EXPECT_NEAR(gate[t * 3 + j], g[j], 1e-6);
      }
    }
    EXPECT_EQ(expert[5 * 3 + 0], 2);
    EXPECT_EQ(expert[5 * 3 + 1], 6);
  }
}

// L = sum_tj w[t, j] gate[t, j] + sum_te a[t / seq, e] probs[t, e]: the gradient moe_route_backward gives for
// dgate = w and aux_grad = a, against central differences of L in float64 (the same choices on both sides).
TEST(MoeKernels, RouteBackwardIsTheGradient) {
  std::mt19937_64 rng(12);
  for (bool normalize : {true, false}) {
    const std::int64_t T = 6, E = 5, K = 2, seq = 3;
    const MoeRouteShape s{T, E, K, normalize};
    Vec logits = random_vec(rng, T * E), w = random_vec(rng, T * K), a = random_vec(rng, (T / seq) * E);
    Vec probs(T * E), gate(T * K), dlogits(T * E);
    std::vector<std::int32_t> expert(T * K);
    cpu::moe_route(s, logits.data(), probs.data(), expert.data(), gate.data());
    cpu::moe_route_backward(s, probs.data(), expert.data(), w.data(), a.data(), seq, dlogits.data());
    auto objective = [&](std::int64_t t, const std::vector<double>& x) {
      Vec xf(x.begin(), x.end());
      std::vector<double> p, g;
      std::vector<int> top;
      reference_route(s, xf.data(), p, top, g);
      double l = 0;
      for (int j = 0; j < K; ++j) {
        // The choices are held fixed (they are piecewise constant).
        double pj = p[expert[t * K + j]];
        double sum = 0;
        for (int i = 0; i < K; ++i) sum += p[expert[t * K + i]];
        l += w[t * K + j] * (normalize ? pj / sum : pj);
      }
      for (int e = 0; e < E; ++e) l += a[(t / seq) * E + e] * p[e];
      return l;
    };
    // reference_route rounds its input to float: differentiate on a scale where that is exact enough.
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t e = 0; e < E; ++e) {
        std::vector<double> xp(logits.begin() + t * E, logits.begin() + (t + 1) * E), xm = xp;
        const double h = 1e-2;
        xp[e] += h;
        xm[e] -= h;
        const double numeric = (objective(t, xp) - objective(t, xm)) / (2 * h);
        EXPECT_NEAR(dlogits[t * E + e], numeric, 2e-4 * (1 + std::fabs(numeric))) << "token " << t << " expert " << e;
      }
    }
  }
}

TEST(MoeKernels, PermutationsAndTheirGradients) {
  std::mt19937_64 rng(13);
  const std::int64_t T = 4, K = 2, cols = 3;
  // Rows grouped by expert; token 2's second choice dropped.
  const std::vector<std::int32_t> rows = {0, 2, 3, 0, 1, 3, 1};
  const std::vector<std::int32_t> slot = {0, 3, 4, 6, 1, -1, 2, 5};
  Vec x = random_vec(rng, T * cols), gate = random_vec(rng, T * K);
  Vec xe(rows.size() * cols);
  cpu::moe_gather_rows(static_cast<std::int64_t>(rows.size()), cols, x.data(), rows.data(), xe.data());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::int64_t c = 0; c < cols; ++c) EXPECT_EQ(xe[i * cols + c], x[rows[i] * cols + c]);
  }
  Vec out(T * cols, 99.0f);
  cpu::moe_unpermute(T, K, cols, xe.data(), slot.data(), gate.data(), false, out.data());
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < cols; ++c) {
      double want = 0;
      for (std::int64_t j = 0; j < K; ++j) {
        if (slot[t * K + j] >= 0) want += gate[t * K + j] * xe[slot[t * K + j] * cols + c];
      }
      EXPECT_NEAR(out[t * cols + c], want, 1e-6);
    }
  }
  // Unweighted and accumulating: each token gets back the sum of its kept copies, added.
  Vec acc(T * cols, 1.0f);
  cpu::moe_unpermute(T, K, cols, xe.data(), slot.data(), nullptr, true, acc.data());
  EXPECT_NEAR(acc[2 * cols], 1.0f + x[2 * cols], 1e-6);  // token 2: one copy kept
  EXPECT_NEAR(acc[0], 1.0f + 2 * x[0], 1e-6);            // token 0: two copies

  Vec dout = random_vec(rng, T * cols), dxe(rows.size() * cols, 99.0f), dgate(T * K, 99.0f);
  cpu::moe_unpermute_backward(T, K, cols, dout.data(), xe.data(), slot.data(), gate.data(), dxe.data(), dgate.data());
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t j = 0; j < K; ++j) {
      const std::int32_t r = slot[t * K + j];
      if (r < 0) {
        EXPECT_EQ(dgate[t * K + j], 0.0f);
        continue;
      }
      double dot = 0;
      for (std::int64_t c = 0; c < cols; ++c) {
        EXPECT_NEAR(dxe[r * cols + c], gate[t * K + j] * dout[t * cols + c], 1e-6);
        dot += dout[t * cols + c] * xe[r * cols + c];
      }
      EXPECT_NEAR(dgate[t * K + j], dot, 1e-5);
    }
  }
}

}  // namespace
}  // namespace dtrain::kernels
