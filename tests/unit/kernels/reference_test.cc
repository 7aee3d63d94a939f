// The float64 references prove themselves: each reference backward equals central finite differences of its own
// reference forward. With h = 1e-6 in float64 the difference quotient is accurate to about 1e-9 relative (truncation
// h^2 |f'''| plus roundoff 1e-16 / h), so 1e-7 is a bound with room and still far below the kernels' 1e-5.
#include "reference.h"

#include <gtest/gtest.h>

namespace dtrain::kernels::testing {
namespace {

constexpr double kFdTolerance = 1e-7;

Vec weights_for(std::mt19937_64& rng, std::size_t n) { return to_double(random_floats(rng, n)); }

TEST(ReferenceGradcheck, Linear) {
  auto rng = make_rng(11);
  const std::int64_t T = 3, in = 5, out = 4;
  const std::vector<Vec> inputs = {to_double(random_floats(rng, T * in)), to_double(random_floats(rng, out * in)),
                                   to_double(random_floats(rng, out))};
  auto f = [&](const std::vector<Vec>& x) { return ref::linear_forward(T, in, out, x[0], x[1], x[2]); };
  const Vec r = weights_for(rng, T * out);
  const auto g = ref::linear_backward(T, in, out, r, inputs[0], inputs[1]);
  EXPECT_LT(rel_error(g.dx, numeric_gradient(f, inputs, 0, r)), kFdTolerance);
  EXPECT_LT(rel_error(g.dw, numeric_gradient(f, inputs, 1, r)), kFdTolerance);
  EXPECT_LT(rel_error(g.db, numeric_gradient(f, inputs, 2, r)), kFdTolerance);
}

TEST(ReferenceGradcheck, EmbeddingAndPositions) {
  auto rng = make_rng(12);
  const std::int64_t batch = 2, seq = 3, hidden = 4, vocab = 9;
  const VocabShard shard{2, 7};
  const IVec ids = random_ids(rng, batch * seq, vocab);
  const std::vector<Vec> table = {to_double(random_floats(rng, shard.size() * hidden))};
  auto f = [&](const std::vector<Vec>& x) { return ref::embedding_forward(batch * seq, hidden, ids, x[0], shard); };
  const Vec r = weights_for(rng, batch * seq * hidden);
  EXPECT_LT(rel_error(ref::embedding_backward(batch * seq, hidden, ids, r, shard), numeric_gradient(f, table, 0, r)),
            kFdTolerance);

  const std::vector<Vec> xp = {to_double(random_floats(rng, batch * seq * hidden)),
                               to_double(random_floats(rng, seq * hidden))};
  auto fp = [&](const std::vector<Vec>& x) { return ref::position_forward(batch, seq, hidden, x[0], x[1]); };
  EXPECT_LT(rel_error(ref::position_backward(batch, seq, hidden, r), numeric_gradient(fp, xp, 1, r)), kFdTolerance);
}

TEST(ReferenceGradcheck, Rope) {
  auto rng = make_rng(13);
  const std::int64_t batch = 2, seq = 5, heads = 3, d = 6;
  const std::vector<Vec> x = {to_double(random_floats(rng, batch * seq * heads * d))};
  auto f = [&](const std::vector<Vec>& in) { return ref::rope_forward(batch, seq, heads, d, 10000.0, in[0]); };
  const Vec r = weights_for(rng, x[0].size());
  EXPECT_LT(rel_error(ref::rope_backward(batch, seq, heads, d, 10000.0, r), numeric_gradient(f, x, 0, r)),
            kFdTolerance);
}

TEST(ReferenceGradcheck, LayerNorm) {
  auto rng = make_rng(14);
  const std::int64_t rows = 3, h = 7;
  const std::vector<Vec> in = {to_double(random_floats(rng, rows * h)), to_double(random_floats(rng, h)),
                               to_double(random_floats(rng, h))};
  auto f = [&](const std::vector<Vec>& x) { return ref::layernorm_forward(rows, h, x[0], x[1], x[2], 1e-5); };
  const Vec r = weights_for(rng, rows * h);
  const auto g = ref::layernorm_backward(rows, h, in[0], in[1], 1e-5, r);
  EXPECT_LT(rel_error(g.dx, numeric_gradient(f, in, 0, r)), kFdTolerance);
  EXPECT_LT(rel_error(g.dgamma, numeric_gradient(f, in, 1, r)), kFdTolerance);
  EXPECT_LT(rel_error(g.dbeta, numeric_gradient(f, in, 2, r)), kFdTolerance);
}

TEST(ReferenceGradcheck, RmsNorm) {
  auto rng = make_rng(15);
  const std::int64_t rows = 3, h = 7;
  const std::vector<Vec> in = {to_double(random_floats(rng, rows * h)), to_double(random_floats(rng, h))};
  auto f = [&](const std::vector<Vec>& x) { return ref::rmsnorm_forward(rows, h, x[0], x[1], 1e-5); };
  const Vec r = weights_for(rng, rows * h);
  const auto g = ref::rmsnorm_backward(rows, h, in[0], in[1], 1e-5, r);
  EXPECT_LT(rel_error(g.dx, numeric_gradient(f, in, 0, r)), kFdTolerance);
  EXPECT_LT(rel_error(g.dgamma, numeric_gradient(f, in, 1, r)), kFdTolerance);
}

void check_attention(const ref::AttentionDims& a, const ref::AttentionDropoutRef* drop, std::uint64_t seed) {
  auto rng = make_rng(seed);
  const std::vector<Vec> in = {to_double(random_floats(rng, a.batch * a.seq * a.heads * a.d)),
                               to_double(random_floats(rng, a.batch * a.seq * a.kv_heads * a.d)),
                               to_double(random_floats(rng, a.batch * a.seq * a.kv_heads * a.d))};
  auto f = [&](const std::vector<Vec>& x) { return ref::attention_forward(a, x[0], x[1], x[2], drop); };
  const Vec r = weights_for(rng, in[0].size());
  const auto g = ref::attention_backward(a, in[0], in[1], in[2], r, drop);
  EXPECT_LT(rel_error(g.dq, numeric_gradient(f, in, 0, r)), kFdTolerance);
  EXPECT_LT(rel_error(g.dk, numeric_gradient(f, in, 1, r)), kFdTolerance);
  EXPECT_LT(rel_error(g.dv, numeric_gradient(f, in, 2, r)), kFdTolerance);
}

TEST(ReferenceGradcheck, AttentionGqa) { check_attention({2, 5, 4, 2, 3}, nullptr, 16); }

TEST(ReferenceGradcheck, AttentionWithDropout) {
  ref::AttentionDropoutRef drop{0.3, DropoutKey{7, 3, 1, DropoutSite::kAttentionProbs}, 0, 0, 2};
  check_attention({2, 5, 2, 1, 3}, &drop, 17);
}

TEST(ReferenceGradcheck, Gelu) {
  auto rng = make_rng(18);
  const std::vector<Vec> in = {to_double(random_floats(rng, 40, 2.0))};
  const Vec r = weights_for(rng, 40);
  auto f = [&](const std::vector<Vec>& x) { return ref::gelu_forward(x[0]); };
  EXPECT_LT(rel_error(ref::gelu_backward(in[0], r), numeric_gradient(f, in, 0, r)), kFdTolerance);
}

TEST(ReferenceGradcheck, SwiGlu) {
  auto rng = make_rng(19);
  const std::int64_t tokens = 3, ffn = 5;
  const std::vector<Vec> in = {to_double(random_floats(rng, tokens * 2 * ffn, 2.0))};
  const Vec r = weights_for(rng, tokens * ffn);
  auto f = [&](const std::vector<Vec>& x) { return ref::swiglu_forward(tokens, ffn, x[0]); };
  EXPECT_LT(rel_error(ref::swiglu_backward(tokens, ffn, in[0], r), numeric_gradient(f, in, 0, r)), kFdTolerance);
}

TEST(ReferenceGradcheck, DropoutAdd) {
  auto rng = make_rng(20);
  const HiddenLayout l{2, 3, 5, 4, 1, 6};
  const DropoutKey key{99, 5, 2, DropoutSite::kMlpOutput};
  const std::vector<Vec> in = {to_double(random_floats(rng, 30)), to_double(random_floats(rng, 30))};
  const Vec r = weights_for(rng, 30);
  auto f = [&](const std::vector<Vec>& x) { return ref::dropout_add_forward(l, x[0], x[1], 0.25, key); };
  EXPECT_LT(rel_error(ref::dropout_add_backward(l, r, 0.25, key), numeric_gradient(f, in, 0, r)), kFdTolerance);
  EXPECT_LT(rel_error(r, numeric_gradient(f, in, 1, r)), kFdTolerance);
}

TEST(ReferenceGradcheck, CrossEntropy) {
  auto rng = make_rng(21);
  const std::int64_t tokens = 4, vocab = 7;
  const IVec targets = random_ids(rng, tokens, vocab);
  const std::vector<Vec> in = {to_double(random_floats(rng, tokens * vocab, 3.0))};
  const Vec r = weights_for(rng, tokens);
  auto f = [&](const std::vector<Vec>& x) { return ref::cross_entropy_forward(tokens, vocab, x[0], targets); };
  EXPECT_LT(rel_error(ref::cross_entropy_backward(tokens, vocab, in[0], targets, r), numeric_gradient(f, in, 0, r)),
            kFdTolerance);
}

}  // namespace
}  // namespace dtrain::kernels::testing
