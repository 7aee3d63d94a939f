// Vocab-parallel cross entropy: the phases against the float64 reference, and two simulated vocab shards (partial
// results summed as the all-reduces would) against the unsharded result.
#include "dtrain/kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

struct CeResult {
  FVec loss, dlogits;
  double mean = 0;
};

// Runs the phases over the given shards of [0, vocab) (one shard: tp = 1), summing/maxing across shards where the
// caller would all-reduce.
CeResult run_sharded(std::int64_t tokens, std::int64_t vocab, const FVec& logits, const IVec& targets,
                     const FVec& dloss, const std::vector<VocabShard>& shards) {
  std::vector<FVec> local(shards.size());
  for (std::size_t r = 0; r < shards.size(); ++r) {
    local[r].resize(tokens * shards[r].size());
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::copy_n(logits.begin() + t * vocab + shards[r].begin, shards[r].size(),
                  local[r].begin() + t * shards[r].size());
    }
  }
  FVec max(tokens, -INFINITY), sum_exp(tokens, 0.0f), target(tokens, 0.0f);
  for (std::size_t r = 0; r < shards.size(); ++r) {  // all-reduce MAX
    FVec m(tokens);
    cpu::cross_entropy_max(tokens, local[r].data(), shards[r], m.data());
    for (std::int64_t t = 0; t < tokens; ++t) max[t] = std::max(max[t], m[t]);
  }
  for (std::size_t r = 0; r < shards.size(); ++r) {  // all-reduce SUM of both
    FVec e(tokens), z(tokens);
    cpu::cross_entropy_sum_exp(tokens, local[r].data(), targets.data(), shards[r], max.data(), e.data(), z.data());
    for (std::int64_t t = 0; t < tokens; ++t) {
      sum_exp[t] += e[t];
      target[t] += z[t];
    }
  }
  CeResult res{FVec(tokens), FVec(tokens * vocab), 0};
  res.mean = cpu::cross_entropy_loss(tokens, max.data(), sum_exp.data(), target.data(), res.loss.data());
  for (std::size_t r = 0; r < shards.size(); ++r) {
    FVec d(local[r].size());
    cpu::cross_entropy_backward(tokens, local[r].data(), targets.data(), shards[r], max.data(), sum_exp.data(),
                                dloss.data(), d.data());
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::copy_n(d.begin() + t * shards[r].size(), shards[r].size(),
                  res.dlogits.begin() + t * vocab + shards[r].begin);
    }
  }
  return res;
}

struct CeCase {
  std::int64_t tokens, vocab, split;
};

class CrossEntropyTest : public ::testing::TestWithParam<CeCase> {};

TEST_P(CrossEntropyTest, UnshardedAndTwoShardsMatchReference) {
  const auto c = GetParam();
  auto rng = make_rng(900 + c.tokens + c.vocab);
  const FVec logits = random_floats(rng, c.tokens * c.vocab, 4.0);
  const IVec targets = random_ids(rng, c.tokens, static_cast<std::int32_t>(c.vocab));
  const FVec dloss(c.tokens, 1.0f / static_cast<float>(c.tokens));  // gradient of the mean
  const Vec loss_ref = ref::cross_entropy_forward(c.tokens, c.vocab, to_double(logits), targets);
  const Vec d_ref = ref::cross_entropy_backward(c.tokens, c.vocab, to_double(logits), targets, to_double(dloss));
  double mean_ref = 0;
  for (double l : loss_ref) mean_ref += l / c.tokens;

  const CeResult one = run_sharded(c.tokens, c.vocab, logits, targets, dloss, {{0, c.vocab}});
  const CeResult two = run_sharded(c.tokens, c.vocab, logits, targets, dloss, {{0, c.split}, {c.split, c.vocab}});
  for (const CeResult* r : {&one, &two}) {
    EXPECT_LT(ref_error(r->loss, loss_ref), kFp32Tolerance);
    EXPECT_LT(ref_error(r->dlogits, d_ref), kFp32Tolerance);
    EXPECT_NEAR(r->mean, mean_ref, kFp32Tolerance * mean_ref);
  }
  // Sharded against unsharded: only the summation order of the exponentials differs.
  EXPECT_LT(rel_error(two.loss, to_double(one.loss)), 1e-6);
  EXPECT_LT(rel_error(two.dlogits, to_double(one.dlogits)), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropyTest,
                         ::testing::Values(CeCase{256, 256, 128},     // tiny model, tp = 2
                                           CeCase{64, 50257, 25129},  // GPT-2 vocabulary, uneven split
                                           CeCase{7, 11, 3}, CeCase{1, 2, 1}));

TEST(CrossEntropyTest, BackwardMayOverwriteLogits) {
  auto rng = make_rng(950);
  const std::int64_t tokens = 9, vocab = 33;
  FVec logits = random_floats(rng, tokens * vocab);
  const IVec targets = random_ids(rng, tokens, vocab);
  const FVec dloss(tokens, 0.5f);
  FVec max(tokens), e(tokens), z(tokens), d(logits.size());
  const VocabShard all{0, vocab};
  cpu::cross_entropy_max(tokens, logits.data(), all, max.data());
  cpu::cross_entropy_sum_exp(tokens, logits.data(), targets.data(), all, max.data(), e.data(), z.data());
  cpu::cross_entropy_backward(tokens, logits.data(), targets.data(), all, max.data(), e.data(), dloss.data(), d.data());
  cpu::cross_entropy_backward(tokens, logits.data(), targets.data(), all, max.data(), e.data(), dloss.data(),
                              logits.data());
  EXPECT_TRUE(bitwise_equal(d, logits));
}

// Logits far apart (a confident model) must not overflow: the max is subtracted before exponentiating.
TEST(CrossEntropyTest, LargeLogitsStayFinite) {
  const std::int64_t vocab = 4;
  const FVec logits = {1000.0f, -1000.0f, 0.0f, 999.0f};
  const IVec targets = {3};
  const FVec dloss = {1.0f};
  const CeResult r = run_sharded(1, vocab, logits, targets, dloss, {{0, 2}, {2, 4}});
  EXPECT_NEAR(r.loss[0], std::log1p(std::exp(-1.0)) + 1.0 - 0.0, 1e-5);
  EXPECT_TRUE(std::isfinite(r.dlogits[0]));
}

// A padded vocabulary (Megatron's, dtrain/model/layout_fit.h): columns at or above real_end take no probability and
// get no gradient, whatever their logits, so the loss and the real columns' gradients are the unpadded ones. Padded
// to 16 over two shards of 8, the real vocabulary 6: the second shard is padding alone.
TEST(CrossEntropyTest, PaddingColumnsTakeNoProbability) {
  auto rng = make_rng(960);
  const std::int64_t tokens = 5, vocab = 6, padded = 16;
  const FVec real_logits = random_floats(rng, tokens * vocab, 4.0);
  const IVec targets = random_ids(rng, tokens, static_cast<std::int32_t>(vocab));
  const FVec dloss(tokens, 1.0f / tokens);
  FVec logits(tokens * padded, 50.0f);  // padding logits far above the real ones: they would dominate the softmax
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::copy_n(real_logits.begin() + t * vocab, vocab, logits.begin() + t * padded);
  }
  const CeResult plain = run_sharded(tokens, vocab, real_logits, targets, dloss, {{0, vocab}});
  for (const auto& shards :
       {std::vector<VocabShard>{{0, padded, vocab}}, std::vector<VocabShard>{{0, 8, vocab}, {8, 16, vocab}}}) {
    const CeResult padded_result = run_sharded(tokens, padded, logits, targets, dloss, shards);
    EXPECT_LT(rel_error(padded_result.loss, to_double(plain.loss)), 1e-6);
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t j = 0; j < padded; ++j) {
        const float want = j < vocab ? plain.dlogits[t * vocab + j] : 0.0f;
        EXPECT_NEAR(padded_result.dlogits[t * padded + j], want, 1e-6) << "token " << t << " column " << j;
      }
    }
  }
  EXPECT_EQ((VocabShard{8, 16, 6}.real_size()), 0);
  EXPECT_EQ((VocabShard{0, 8, 6}.real_size()), 6);
  EXPECT_EQ((VocabShard{0, 8}.real_size()), 8);
}

}  // namespace
}  // namespace dtrain::kernels::testing
