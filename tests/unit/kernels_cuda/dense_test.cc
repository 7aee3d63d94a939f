// Linear (cuBLASLt), LayerNorm/RMSNorm, embeddings and cross entropy on the GPU against the CPU backend.
#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/kernels/cross_entropy.h"
#include "dtrain/kernels/cuda/cross_entropy.h"
#include "dtrain/kernels/cuda/embedding.h"
#include "dtrain/kernels/cuda/linear.h"
#include "dtrain/kernels/cuda/norm.h"
#include "dtrain/kernels/embedding.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/norm.h"
#include "support.h"

namespace dtrain::kernels::cuda::testing {
namespace {

using LinearTest = CudaTest;

TEST_F(LinearTest, ForwardAndBackwardMatchCpu) {
  const LinearShape s{37, 96, 80};
  auto rng = make_rng(11);
  const FVec x = random_bf16_values(rng, s.tokens * s.in_features);
  const FVec w = random_bf16_values(rng, s.out_features * s.in_features, 0.1);
  const FVec b = random_bf16_values(rng, s.out_features);
  const FVec dy = random_bf16_values(rng, s.tokens * s.out_features);
  const FVec dw0 = random_floats(rng, w.size());  // gradients accumulate into what is there
  const FVec db0 = random_floats(rng, b.size());

  FVec y_cpu(s.tokens * s.out_features), dx_cpu(x.size()), dw_cpu = dw0, db_cpu = db0;
  cpu::linear_forward(s, x.data(), w.data(), b.data(), y_cpu.data());
  cpu::linear_backward(s, dy.data(), x.data(), w.data(), dx_cpu.data(), dw_cpu.data(), db_cpu.data());

  const auto x_dev = to_device_bf16(ctx(), x), w_dev = to_device_bf16(ctx(), w), b_dev = to_device_bf16(ctx(), b);
  const auto ddy = to_device_bf16(ctx(), dy);
  auto y = poisoned<bf16>(ctx(), y_cpu.size());
  linear_forward(ctx(), s, x_dev.data(), w_dev.data(), b_dev.data(), y.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), y), y_cpu), kBf16Tolerance);

  // The fp32-output overload (logits): only summation order differs from the CPU.
  const auto bias32 = to_device(ctx(), b);
  auto y32 = poisoned<float>(ctx(), y_cpu.size());
  linear_forward(ctx(), s, x_dev.data(), w_dev.data(), bias32.data(), y32.data());
  EXPECT_LT(rel_error(to_host(ctx(), y32), y_cpu), kFp32Tolerance);

  auto dx = poisoned<bf16>(ctx(), x.size());
  auto dw = to_device(ctx(), dw0);
  auto db = to_device(ctx(), db0);
  linear_backward(ctx(), s, ddy.data(), x_dev.data(), w_dev.data(), dx.data(), dw.data(), db.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), dx), dx_cpu), kBf16Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), dw), dw_cpu), kFp32Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), db), db_cpu), kFp32Tolerance);
}

TEST_F(LinearTest, NoBiasAndRepeatable) {
  const LinearShape s{64, 128, 192};
  auto rng = make_rng(12);
  const FVec x = random_bf16_values(rng, s.tokens * s.in_features);
  const FVec w = random_bf16_values(rng, s.out_features * s.in_features, 0.1);
  FVec y_cpu(s.tokens * s.out_features);
  cpu::linear_forward(s, x.data(), w.data(), nullptr, y_cpu.data());
  const auto dx = to_device_bf16(ctx(), x), dw = to_device_bf16(ctx(), w);
  auto y1 = poisoned<bf16>(ctx(), y_cpu.size()), y2 = poisoned<bf16>(ctx(), y_cpu.size());
  linear_forward(ctx(), s, dx.data(), dw.data(), static_cast<const bf16*>(nullptr), y1.data());
  linear_forward(ctx(), s, dx.data(), dw.data(), static_cast<const bf16*>(nullptr), y2.data());
  const BVec h1 = to_host(ctx(), y1);
  EXPECT_LT(rel_error(from_bf16_vec(h1), y_cpu), kBf16Tolerance);
  EXPECT_EQ(h1, to_host(ctx(), y2));  // one cached algorithm per shape: bitwise repeatable
}

using NormTest = CudaTest;

TEST_F(NormTest, LayerNormMatchesCpu) {
  const NormShape s{19, 200};
  auto rng = make_rng(21);
  FVec x = random_bf16_values(rng, s.rows * s.hidden);
  for (float& v : x) v = round_to_bf16(v + 3.0f);  // a mean well away from 0: the two-pass variance matters
  const FVec gamma = random_floats(rng, s.hidden), beta = random_floats(rng, s.hidden);
  const FVec dy = random_bf16_values(rng, x.size());
  const FVec dgamma0 = random_floats(rng, s.hidden), dbeta0 = random_floats(rng, s.hidden);
  FVec y_cpu(x.size()), mean_cpu(s.rows), rstd_cpu(s.rows), dx_cpu(x.size()), dgamma_cpu = dgamma0, dbeta_cpu = dbeta0;
  cpu::layernorm_forward(s, x.data(), gamma.data(), beta.data(), 1e-5f, y_cpu.data(), mean_cpu.data(), rstd_cpu.data());
  cpu::layernorm_backward(s, x.data(), gamma.data(), mean_cpu.data(), rstd_cpu.data(), dy.data(), dx_cpu.data(),
                          dgamma_cpu.data(), dbeta_cpu.data());

  const auto dx_in = to_device_bf16(ctx(), x), ddy = to_device_bf16(ctx(), dy);
  const auto dgamma_w = to_device(ctx(), gamma), dbeta_w = to_device(ctx(), beta);
  auto y = poisoned<bf16>(ctx(), x.size());
  auto mean = poisoned<float>(ctx(), s.rows), rstd = poisoned<float>(ctx(), s.rows);
  layernorm_forward(ctx(), s, dx_in.data(), dgamma_w.data(), dbeta_w.data(), 1e-5f, y.data(), mean.data(), rstd.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), y), y_cpu), kBf16Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), mean), mean_cpu), kFp32Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), rstd), rstd_cpu), kFp32Tolerance);

  auto dx = poisoned<bf16>(ctx(), x.size());
  auto dgamma = to_device(ctx(), dgamma0), dbeta = to_device(ctx(), dbeta0);
  layernorm_backward(ctx(), s, dx_in.data(), dgamma_w.data(), mean.data(), rstd.data(), ddy.data(), dx.data(),
                     dgamma.data(), dbeta.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), dx), dx_cpu), kBf16Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), dgamma), dgamma_cpu), kFp32Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), dbeta), dbeta_cpu), kFp32Tolerance);
}

// Rows of 64 (8 elements a load) and of 67 (one at a time, the same results); more rows than one 64-row chunk of
// the column sums.
class RmsNorm : public CudaTest, public ::testing::WithParamInterface<std::int64_t> {};

TEST_P(RmsNorm, MatchesCpu) {
  const NormShape s{130, GetParam()};
  auto rng = make_rng(22);
  const FVec x = random_bf16_values(rng, s.rows * s.hidden);
  const FVec gamma = random_floats(rng, s.hidden);
  const FVec dy = random_bf16_values(rng, x.size());
  FVec y_cpu(x.size()), rstd_cpu(s.rows), dx_cpu(x.size()), dgamma_cpu(s.hidden, 0.0f);
  cpu::rmsnorm_forward(s, x.data(), gamma.data(), 1e-6f, y_cpu.data(), rstd_cpu.data());
  cpu::rmsnorm_backward(s, x.data(), gamma.data(), rstd_cpu.data(), dy.data(), dx_cpu.data(), dgamma_cpu.data());

  const auto dx_in = to_device_bf16(ctx(), x), ddy = to_device_bf16(ctx(), dy);
  const auto dgamma_w = to_device(ctx(), gamma);
  auto y = poisoned<bf16>(ctx(), x.size());
  auto rstd = poisoned<float>(ctx(), s.rows);
  rmsnorm_forward(ctx(), s, dx_in.data(), dgamma_w.data(), 1e-6f, y.data(), rstd.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), y), y_cpu), kBf16Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), rstd), rstd_cpu), kFp32Tolerance);
  auto dx = poisoned<bf16>(ctx(), x.size());
  auto dgamma = to_device(ctx(), FVec(s.hidden, 0.0f));
  rmsnorm_backward(ctx(), s, dx_in.data(), dgamma_w.data(), rstd.data(), ddy.data(), dx.data(), dgamma.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), dx), dx_cpu), kBf16Tolerance);
  EXPECT_LT(rel_error(to_host(ctx(), dgamma), dgamma_cpu), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Rows, RmsNorm, ::testing::Values(64, 67));

using EmbeddingTest = CudaTest;

TEST_F(EmbeddingTest, VocabShardForwardAndBackwardMatchCpuBitwise) {
  const std::int64_t tokens = 300, hidden = 72;
  const VocabShard shard{10, 50};
  auto rng = make_rng(31);
  const IVec ids = random_ids(rng, tokens, 64);  // some outside the shard, many repeated
  const FVec table = random_bf16_values(rng, shard.size() * hidden);
  const FVec dout = random_bf16_values(rng, tokens * hidden);
  const FVec dtable0 = random_floats(rng, table.size());
  FVec out_cpu(tokens * hidden), dtable_cpu = dtable0;
  cpu::embedding_forward(tokens, hidden, ids.data(), table.data(), shard, out_cpu.data());
  cpu::embedding_backward(tokens, hidden, ids.data(), dout.data(), shard, dtable_cpu.data());

  const auto dids = to_device(ctx(), ids);
  const auto dtab = to_device_bf16(ctx(), table), ddout = to_device_bf16(ctx(), dout);
  auto out = poisoned<bf16>(ctx(), out_cpu.size());
  embedding_forward(ctx(), tokens, hidden, dids.data(), dtab.data(), shard, out.data());
  EXPECT_EQ(to_host_float(ctx(), out), out_cpu);  // a copy of bf16 rows (or zeros): exact
  auto dtable = to_device(ctx(), dtable0);
  embedding_backward(ctx(), tokens, hidden, dids.data(), ddout.data(), shard, dtable.data());
  EXPECT_EQ(to_host(ctx(), dtable), dtable_cpu);  // the same fp32 additions in token order (embedding.h)
}

TEST_F(EmbeddingTest, PositionsMatchCpu) {
  const std::int64_t batch = 3, seq = 17, hidden = 40;
  auto rng = make_rng(32);
  const FVec x = random_bf16_values(rng, batch * seq * hidden);
  const FVec pos = random_bf16_values(rng, seq * hidden);
  const FVec dpos0 = random_floats(rng, pos.size());
  FVec x_cpu = x, dpos_cpu = dpos0;
  cpu::position_embedding_forward(batch, seq, hidden, pos.data(), x_cpu.data());
  cpu::position_embedding_backward(batch, seq, hidden, x.data(), dpos_cpu.data());
  auto dx = to_device_bf16(ctx(), x);
  const auto dp = to_device_bf16(ctx(), pos);
  auto dpos = to_device(ctx(), dpos0);
  position_embedding_backward(ctx(), batch, seq, hidden, dx.data(), dpos.data());
  position_embedding_forward(ctx(), batch, seq, hidden, dp.data(), dx.data());
  EXPECT_EQ(to_host_float(ctx(), dx), round_bf16(x_cpu));  // one fp32 add of bf16 values, rounded once
  EXPECT_LT(rel_error(to_host(ctx(), dpos), dpos_cpu), kFp32Tolerance);
}

using CrossEntropyTest = CudaTest;

// Three shapes: rows of a multiple of 8 (the kernels' 16-byte loads), rows of 1003 (one element at a time), and a
// padded vocabulary whose 997 real columns end inside a group of 8.
class CrossEntropyPhases : public CudaTest,
                           public ::testing::WithParamInterface<std::pair<std::int64_t, std::int64_t>> {};

TEST_P(CrossEntropyPhases, MatchCpu) {
  const std::int64_t tokens = 45, vocab = GetParam().first, real = GetParam().second;
  const VocabShard shard{0, vocab, real};
  auto rng = make_rng(41);
  const FVec logits = random_bf16_values(rng, tokens * vocab, 3.0);
  const IVec targets = random_ids(rng, tokens, static_cast<std::int32_t>(real));
  const FVec dloss(tokens, 1.0f / static_cast<float>(tokens));
  FVec max_cpu(tokens), sum_cpu(tokens), target_cpu(tokens), loss_cpu(tokens), dlogits_cpu(logits.size());
  cpu::cross_entropy_max(tokens, logits.data(), shard, max_cpu.data());
  cpu::cross_entropy_sum_exp(tokens, logits.data(), targets.data(), shard, max_cpu.data(), sum_cpu.data(),
                             target_cpu.data());
  const double mean_cpu =
      cpu::cross_entropy_loss(tokens, max_cpu.data(), sum_cpu.data(), target_cpu.data(), loss_cpu.data());
  cpu::cross_entropy_backward(tokens, logits.data(), targets.data(), shard, max_cpu.data(), sum_cpu.data(),
                              dloss.data(), dlogits_cpu.data());

  for (const bool fp32_logits : {false, true}) {
    SCOPED_TRACE(fp32_logits ? "fp32 logits" : "bf16 logits");
    const auto dt = to_device(ctx(), targets);
    const auto dl = to_device(ctx(), dloss);
    auto mx = poisoned<float>(ctx(), tokens), se = poisoned<float>(ctx(), tokens), tl = poisoned<float>(ctx(), tokens);
    auto loss = poisoned<float>(ctx(), tokens);
    auto mean = poisoned<double>(ctx(), 1);
    FVec dlogits;
    if (fp32_logits) {
      auto lg = to_device(ctx(), logits);
      cross_entropy_max(ctx(), tokens, lg.data(), shard, mx.data());
      cross_entropy_sum_exp(ctx(), tokens, lg.data(), dt.data(), shard, mx.data(), se.data(), tl.data());
      cross_entropy_loss(ctx(), tokens, mx.data(), se.data(), tl.data(), loss.data(), mean.data());
      cross_entropy_backward(ctx(), tokens, lg.data(), dt.data(), shard, mx.data(), se.data(), dl.data(), lg.data());
      dlogits = to_host(ctx(), lg);  // in place: dlogits aliases logits
    } else {
      auto lg = to_device_bf16(ctx(), logits);
      cross_entropy_max(ctx(), tokens, lg.data(), shard, mx.data());
      cross_entropy_sum_exp(ctx(), tokens, lg.data(), dt.data(), shard, mx.data(), se.data(), tl.data());
      cross_entropy_loss(ctx(), tokens, mx.data(), se.data(), tl.data(), loss.data(), mean.data());
      cross_entropy_backward(ctx(), tokens, lg.data(), dt.data(), shard, mx.data(), se.data(), dl.data(), lg.data());
      dlogits = to_host_float(ctx(), lg);
    }
    EXPECT_EQ(to_host(ctx(), mx), max_cpu);     // the max of the same values
    EXPECT_EQ(to_host(ctx(), tl), target_cpu);  // a copy
    EXPECT_LT(rel_error(to_host(ctx(), se), sum_cpu), kFp32Tolerance);
    EXPECT_LT(rel_error(to_host(ctx(), loss), loss_cpu), kFp32Tolerance);
    EXPECT_NEAR(to_host(ctx(), mean)[0], mean_cpu, 1e-5 * std::abs(mean_cpu));
    EXPECT_LT(rel_error(dlogits, dlogits_cpu), fp32_logits ? kFp32Tolerance : kBf16Tolerance);
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t j = real; j < vocab; ++j) ASSERT_EQ(dlogits[t * vocab + j], 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, CrossEntropyPhases,
                         ::testing::Values(std::pair<std::int64_t, std::int64_t>{1000, 1000},
                                           std::pair<std::int64_t, std::int64_t>{1003, 1003},
                                           std::pair<std::int64_t, std::int64_t>{1000, 997}));

TEST_F(CrossEntropyTest, TargetOutsideTheShardGivesZeroTargetLogit) {
  const std::int64_t tokens = 4, vocab = 64;
  const VocabShard shard{64, 128};  // rank 1 of tp = 2 over a 128-word vocabulary
  auto rng = make_rng(42);
  const FVec logits = random_bf16_values(rng, tokens * vocab);
  const IVec targets{3, 70, 127, 64};
  FVec max_cpu(tokens), sum_cpu(tokens), target_cpu(tokens);
  cpu::cross_entropy_max(tokens, logits.data(), shard, max_cpu.data());
  cpu::cross_entropy_sum_exp(tokens, logits.data(), targets.data(), shard, max_cpu.data(), sum_cpu.data(),
                             target_cpu.data());
  const auto lg = to_device_bf16(ctx(), logits);
  const auto dt = to_device(ctx(), targets);
  auto mx = poisoned<float>(ctx(), tokens), se = poisoned<float>(ctx(), tokens), tl = poisoned<float>(ctx(), tokens);
  cross_entropy_max(ctx(), tokens, lg.data(), shard, mx.data());
  cross_entropy_sum_exp(ctx(), tokens, lg.data(), dt.data(), shard, mx.data(), se.data(), tl.data());
  const FVec got = to_host(ctx(), tl);
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got, target_cpu);
}

}  // namespace
}  // namespace dtrain::kernels::cuda::testing
