// Philox4x32-10 and the dropout masks built from it; dropout fused with the residual add.
#include "dtrain/kernels/dropout.h"

#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(PhiloxTest, Random123KnownAnswers) {
  using A4 = std::array<std::uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (A4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (A4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (A4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(DropoutMaskTest, KeepRateAndIndependenceOfKeyFields) {
  const DropoutKey key{2024, 10, 3, DropoutSite::kMlpOutput};
  const std::int64_t n = 200000;
  std::int64_t kept = 0;
  double mean_u = 0;
  for (std::int64_t e = 0; e < n; ++e) {
    const float u = dropout_uniform(key, static_cast<std::uint64_t>(e));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    kept += u >= 0.1f;
    mean_u += u;
  }
  // Binomial(200000, 0.9): standard deviation 134 draws; 6 sigma.
  EXPECT_NEAR(static_cast<double>(kept), 0.9 * n, 6 * 134.0);
  EXPECT_NEAR(mean_u / n, 0.5, 0.005);
  // Each key field changes the stream.
  auto differs = [&](DropoutKey other) {
    int same = 0;
    for (std::uint64_t e = 0; e < 64; ++e) same += dropout_uniform(key, e) == dropout_uniform(other, e);
    return same < 4;
  };
  EXPECT_TRUE(differs({2025, 10, 3, DropoutSite::kMlpOutput}));
  EXPECT_TRUE(differs({2024, 11, 3, DropoutSite::kMlpOutput}));
  EXPECT_TRUE(differs({2024, 10, 4, DropoutSite::kMlpOutput}));
  EXPECT_TRUE(differs({2024, 10, 3, DropoutSite::kAttentionOutput}));
}

TEST(DropoutMaskTest, KeyFieldRanges) {
  EXPECT_THROW(check_dropout_key({1, std::uint64_t{1} << 32, 0, DropoutSite::kEmbedding}), Error);
  EXPECT_THROW(check_dropout_key({1, 0, 1u << 28, DropoutSite::kEmbedding}), Error);
  EXPECT_NO_THROW(
      check_dropout_key({~std::uint64_t{0}, (std::uint64_t{1} << 32) - 1, (1u << 28) - 1, DropoutSite::kMlpOutput}));
}

TEST(DropoutAddTest, MatchesFloat64Reference) {
  for (float p : {0.0f, 0.1f, 0.5f}) {
    auto rng = make_rng(800 + static_cast<int>(p * 10));
    const HiddenLayout l{3, 17, 40, 6, 0, 17};
    const DropoutKey key{5, 9, 2, DropoutSite::kAttentionOutput};
    const std::int64_t n = 3 * 17 * 40;
    const FVec x = random_floats(rng, n), res = random_floats(rng, n), dout = random_floats(rng, n);
    FVec out(n), out_nores(n), dx(n);
    cpu::dropout_add_forward(l, x.data(), res.data(), p, key, out.data());
    cpu::dropout_add_forward(l, x.data(), nullptr, p, key, out_nores.data());
    cpu::dropout_add_backward(l, dout.data(), p, key, dx.data());
    EXPECT_LT(ref_error(out, ref::dropout_add_forward(l, to_double(x), to_double(res), p, key)), kFp32Tolerance) << p;
    EXPECT_LT(ref_error(out_nores, ref::dropout_add_forward(l, to_double(x), {}, p, key)), kFp32Tolerance) << p;
    EXPECT_LT(ref_error(dx, ref::dropout_add_backward(l, to_double(dout), p, key)), kFp32Tolerance) << p;
  }
}

// The same global batch cut differently: one micro-batch of 4 sequences, two micro-batches of 2 (or two
// data-parallel ranks), or one sequence-parallel half of the positions: identical masks element for element.
TEST(DropoutAddTest, MasksIndependentOfMicroBatchAndSequenceSplit) {
  auto rng = make_rng(820);
  const std::int64_t batch = 4, seq = 10, hidden = 8, n = batch * seq * hidden;
  const DropoutKey key{77, 3, 1, DropoutSite::kMlpOutput};
  const FVec x = random_floats(rng, n);
  FVec whole(n);
  cpu::dropout_add_forward({batch, seq, hidden, 0, 0, seq}, x.data(), nullptr, 0.3f, key, whole.data());
  FVec halves(n);
  for (std::int64_t mb = 0; mb < 2; ++mb) {
    const std::int64_t off = mb * 2 * seq * hidden;
    cpu::dropout_add_forward({2, seq, hidden, 2 * mb, 0, seq}, x.data() + off, nullptr, 0.3f, key, halves.data() + off);
  }
  EXPECT_TRUE(bitwise_equal(whole, halves));
  // Sequence parallel, 2 ranks: rank 1 holds positions [5, 10) of each sequence.
  FVec xs(batch * 5 * hidden), ys(xs.size());
  for (std::int64_t b = 0; b < batch; ++b) {
    std::copy_n(x.begin() + (b * seq + 5) * hidden, 5 * hidden, xs.begin() + b * 5 * hidden);
  }
  cpu::dropout_add_forward({batch, 5, hidden, 0, 5, seq}, xs.data(), nullptr, 0.3f, key, ys.data());
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < 5 * hidden; ++i) {
      ASSERT_EQ(ys[b * 5 * hidden + i], whole[(b * seq + 5) * hidden + i]);
    }
  }
}

TEST(ResidualAddTest, AddsInPlace) {
  FVec a = {1, 2, 3}, b = {10, 20, 30};
  cpu::residual_add(3, a.data(), b.data(), a.data());
  EXPECT_EQ(a, (FVec{11, 22, 33}));
}

}  // namespace
}  // namespace dtrain::kernels::testing
