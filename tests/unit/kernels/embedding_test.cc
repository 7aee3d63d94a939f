// Token embedding (vocab-parallel) and learned positions against the float64 reference.
#include "dtrain/kernels/embedding.h"

#include <gtest/gtest.h>

#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

struct EmbeddingCase {
  std::int64_t tokens, hidden, vocab;
  VocabShard shard;
};

class EmbeddingTest : public ::testing::TestWithParam<EmbeddingCase> {};

TEST_P(EmbeddingTest, MatchesFloat64Reference) {
  const auto c = GetParam();
  auto rng = make_rng(200 + c.tokens + c.shard.begin);
  // Repeated ids (tokens > vocab in some cases) exercise the accumulation of one row from several tokens.
  const IVec ids = random_ids(rng, c.tokens, static_cast<std::int32_t>(c.vocab));
  const FVec table = random_floats(rng, c.shard.size() * c.hidden);
  const FVec dout = random_floats(rng, c.tokens * c.hidden);
  const FVec dtable0 = random_floats(rng, table.size());
  FVec out(c.tokens * c.hidden, 123.0f), dtable = dtable0;
  cpu::embedding_forward(c.tokens, c.hidden, ids.data(), table.data(), c.shard, out.data());
  cpu::embedding_backward(c.tokens, c.hidden, ids.data(), dout.data(), c.shard, dtable.data());
  Vec dref = ref::embedding_backward(c.tokens, c.hidden, ids, to_double(dout), c.shard);
  for (std::size_t i = 0; i < dref.size(); ++i) dref[i] += dtable0[i];
  EXPECT_LT(ref_error(out, ref::embedding_forward(c.tokens, c.hidden, ids, to_double(table), c.shard)), kFp32Tolerance);
  EXPECT_LT(ref_error(dtable, dref), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingTest,
                         ::testing::Values(EmbeddingCase{256, 64, 256, {0, 256}},    // tiny model, tp = 1
                                           EmbeddingCase{256, 64, 256, {128, 256}},  // tp = 2, rank 1
                                           EmbeddingCase{37, 19, 150, {37, 101}},    // odd sub-range
                                           EmbeddingCase{1000, 8, 50, {10, 11}}));   // one row, many repeats

// Two vocab shards: the sum of their outputs (the all-reduce) is the unsharded lookup, bit for bit (one shard
// contributes each row, the other zeros).
TEST(EmbeddingTest, ShardsSumToUnsharded) {
  auto rng = make_rng(210);
  const std::int64_t tokens = 50, hidden = 12, vocab = 31, split = 14;
  const IVec ids = random_ids(rng, tokens, vocab);
  const FVec table = random_floats(rng, vocab * hidden);
  FVec full(tokens * hidden), a(tokens * hidden), b(tokens * hidden);
  cpu::embedding_forward(tokens, hidden, ids.data(), table.data(), {0, vocab}, full.data());
  cpu::embedding_forward(tokens, hidden, ids.data(), table.data(), {0, split}, a.data());
  cpu::embedding_forward(tokens, hidden, ids.data(), table.data() + split * hidden, {split, vocab}, b.data());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  EXPECT_TRUE(bitwise_equal(a, full));
}

TEST(PositionEmbeddingTest, MatchesFloat64Reference) {
  for (auto [batch, seq, hidden] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{4, 64, 64}, {3, 7, 5}, {1, 256, 512}}) {
    auto rng = make_rng(220 + seq);
    const FVec x = random_floats(rng, batch * seq * hidden), pos = random_floats(rng, seq * hidden);
    const FVec dx = random_floats(rng, x.size()), dpos0 = random_floats(rng, pos.size());
    FVec y = x, dpos = dpos0;
    cpu::position_embedding_forward(batch, seq, hidden, pos.data(), y.data());
    cpu::position_embedding_backward(batch, seq, hidden, dx.data(), dpos.data());
    Vec dref = ref::position_backward(batch, seq, hidden, to_double(dx));
    for (std::size_t i = 0; i < dref.size(); ++i) dref[i] += dpos0[i];
    EXPECT_LT(ref_error(y, ref::position_forward(batch, seq, hidden, to_double(x), to_double(pos))), kFp32Tolerance);
    EXPECT_LT(ref_error(dpos, dref), kFp32Tolerance);
  }
}

}  // namespace
}  // namespace dtrain::kernels::testing
