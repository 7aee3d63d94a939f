// Causal grouped-query attention (tiled, online softmax) against the materialised float64 reference.
#include "dtrain/kernels/attention.h"

#include <gtest/gtest.h>

#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

struct AttentionCase {
  std::int64_t batch, seq, heads, kv_heads, d;
  float dropout;
};

struct AttentionRun {
  FVec o, lse, dq, dk, dv;
};

// Runs forward and backward with q, k, v (and their gradients) inside one fused [tokens, (h + 2 kv) d] buffer, as
// the QKV projection produces them.
AttentionRun run_fused(const AttentionCase& c, const FVec& q, const FVec& k, const FVec& v, const FVec& dout,
                       const AttentionDropout* drop) {
  const std::int64_t tokens = c.batch * c.seq, qw = c.heads * c.d, kw = c.kv_heads * c.d, stride = qw + 2 * kw;
  FVec qkv(tokens * stride);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::copy_n(q.begin() + t * qw, qw, qkv.begin() + t * stride);
    std::copy_n(k.begin() + t * kw, kw, qkv.begin() + t * stride + qw);
    std::copy_n(v.begin() + t * kw, kw, qkv.begin() + t * stride + qw + kw);
  }
  const AttentionShape s{c.batch, c.seq, c.heads, c.kv_heads, c.d, stride, stride};
  AttentionRun r{FVec(tokens * qw), FVec(c.batch * c.heads * c.seq), FVec(tokens * qw), FVec(tokens * kw),
                 FVec(tokens * kw)};
  FVec dqkv(qkv.size(), 77.0f);  // garbage: the kernel must overwrite every gradient element it owns
  cpu::attention_forward(s, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw, r.o.data(), r.lse.data(), drop);
  cpu::attention_backward(s, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw, r.o.data(), r.lse.data(), dout.data(),
                          dqkv.data(), dqkv.data() + qw, dqkv.data() + qw + kw, drop);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::copy_n(dqkv.begin() + t * stride, qw, r.dq.begin() + t * qw);
    std::copy_n(dqkv.begin() + t * stride + qw, kw, r.dk.begin() + t * kw);
    std::copy_n(dqkv.begin() + t * stride + qw + kw, kw, r.dv.begin() + t * kw);
  }
  return r;
}

class AttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionTest, MatchesFloat64Reference) {
  const auto c = GetParam();
  auto rng = make_rng(500 + c.seq * 3 + c.d);
  const std::int64_t tokens = c.batch * c.seq;
  const FVec q = random_floats(rng, tokens * c.heads * c.d), k = random_floats(rng, tokens * c.kv_heads * c.d);
  const FVec v = random_floats(rng, tokens * c.kv_heads * c.d), dout = random_floats(rng, q.size());
  AttentionDropout drop{c.dropout, DropoutKey{1234, 7, 3, DropoutSite::kAttentionProbs}, 5, 0, c.heads};
  ref::AttentionDropoutRef drop_ref{c.dropout, drop.key, 5, 0, c.heads};
  const bool with_dropout = c.dropout > 0;
  const AttentionRun r = run_fused(c, q, k, v, dout, with_dropout ? &drop : nullptr);

  const ref::AttentionDims a{c.batch, c.seq, c.heads, c.kv_heads, c.d};
  const Vec o_ref =
      ref::attention_forward(a, to_double(q), to_double(k), to_double(v), with_dropout ? &drop_ref : nullptr);
  const auto g = ref::attention_backward(a, to_double(q), to_double(k), to_double(v), to_double(dout),
                                         with_dropout ? &drop_ref : nullptr);
  EXPECT_LT(ref_error(r.o, o_ref), kFp32Tolerance);
  EXPECT_LT(ref_error(r.lse, ref::attention_lse(a, to_double(q), to_double(k))), kFp32Tolerance);
  EXPECT_LT(ref_error(r.dq, g.dq), kFp32Tolerance);
  EXPECT_LT(ref_error(r.dk, g.dk), kFp32Tolerance);
  EXPECT_LT(ref_error(r.dv, g.dv), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttentionCase{4, 64, 4, 2, 16, 0.0f},    // tiny model (GQA 2:1)
                                           AttentionCase{2, 256, 8, 8, 64, 0.0f},   // larger model, MHA
                                           AttentionCase{1, 300, 6, 2, 24, 0.0f},   // crosses block and chunk edges
                                           AttentionCase{2, 129, 3, 3, 5, 0.0f},    // odd head_dim
                                           AttentionCase{3, 1, 2, 1, 8, 0.0f},      // one token
                                           AttentionCase{1, 200, 8, 1, 32, 0.0f},   // multi-query (8:1)
                                           AttentionCase{2, 70, 2, 1, 16, 0.1f},    // dropout on the probabilities
                                           AttentionCase{1, 150, 4, 2, 8, 0.5f}));  // dropout, several chunks

// A tensor-parallel rank holding query heads [2, 4) and kv head 1 of a 4-head / 2-kv-head model computes exactly the
// unsharded run's output for those heads, dropout masks included (global head index in the mask).
TEST(AttentionTest, HeadShardEqualsUnshardedHeads) {
  const AttentionCase full{2, 90, 4, 2, 16, 0.2f};
  auto rng = make_rng(560);
  const std::int64_t tokens = full.batch * full.seq, d = full.d;
  const FVec q = random_floats(rng, tokens * 4 * d), k = random_floats(rng, tokens * 2 * d);
  const FVec v = random_floats(rng, tokens * 2 * d), dout = random_floats(rng, q.size());
  const DropoutKey key{42, 1, 0, DropoutSite::kAttentionProbs};
  const AttentionDropout drop_full{0.2f, key, 0, 0, 4};
  const AttentionRun rf = run_fused(full, q, k, v, dout, &drop_full);

  FVec qs(tokens * 2 * d), ks(tokens * d), vs(tokens * d), douts(tokens * 2 * d);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::copy_n(q.begin() + t * 4 * d + 2 * d, 2 * d, qs.begin() + t * 2 * d);
    std::copy_n(dout.begin() + t * 4 * d + 2 * d, 2 * d, douts.begin() + t * 2 * d);
    std::copy_n(k.begin() + t * 2 * d + d, d, ks.begin() + t * d);
    std::copy_n(v.begin() + t * 2 * d + d, d, vs.begin() + t * d);
  }
  const AttentionDropout drop_shard{0.2f, key, 0, 2, 4};
  const AttentionRun rs = run_fused({2, 90, 2, 1, 16, 0.2f}, qs, ks, vs, douts, &drop_shard);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < 2 * d; ++j) {
      ASSERT_EQ(rs.o[t * 2 * d + j], rf.o[t * 4 * d + 2 * d + j]) << "token " << t;
      ASSERT_EQ(rs.dq[t * 2 * d + j], rf.dq[t * 4 * d + 2 * d + j]) << "token " << t;
    }
    for (std::int64_t j = 0; j < d; ++j) {
      ASSERT_EQ(rs.dk[t * d + j], rf.dk[t * 2 * d + d + j]) << "token " << t;
      ASSERT_EQ(rs.dv[t * d + j], rf.dv[t * 2 * d + d + j]) << "token " << t;
    }
  }
}

// lse is log(sum_j exp(S_ij)) of the causal row: check it on a case computed by hand. With q = 0 every score is 0,
// so row i has lse = log(i + 1) and the output is the mean of the first i + 1 values.
TEST(AttentionTest, ZeroQueriesAverageValues) {
  const std::int64_t seq = 5, d = 4;
  FVec q(seq * d, 0.0f), k(seq * d, 1.0f), v(seq * d), o(seq * d), lse(seq);
  for (std::int64_t t = 0; t < seq; ++t) {
    for (std::int64_t j = 0; j < d; ++j) v[t * d + j] = static_cast<float>(t + 1);
  }
  cpu::attention_forward({1, seq, 1, 1, d, d, d}, q.data(), k.data(), v.data(), o.data(), lse.data(), nullptr);
  for (std::int64_t i = 0; i < seq; ++i) {
    EXPECT_NEAR(lse[i], std::log(static_cast<double>(i + 1)), 1e-6);
    EXPECT_NEAR(o[i * d], (i + 2) / 2.0, 1e-6);
  }
}

}  // namespace
}  // namespace dtrain::kernels::testing
