// Every op run twice gives bitwise identical results, and so does a run with two kernel threads instead of one
// (dtrain's own loops split work into items with disjoint outputs and sum in a fixed order).
#include <gtest/gtest.h>

#include <functional>

#include "dtrain/kernels/activation.h"
#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/cross_entropy.h"
#include "dtrain/kernels/embedding.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/norm.h"
#include "dtrain/kernels/optimizer.h"
#include "dtrain/kernels/rope.h"
#include "dtrain/kernels/threads.h"
#include "reference.h"

namespace dtrain::kernels::testing {
namespace {

using Outputs = std::vector<FVec>;

void expect_repeatable(const std::string& name, const std::function<Outputs()>& run) {
  Outputs first, second, threaded;
  {
    KernelThreads one(1);
    first = run();
    second = run();
  }
  {
    KernelThreads two(2);
    threaded = run();
  }
  ASSERT_EQ(first.size(), second.size());
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(first[i], second[i])) << name << " output " << i << " differs between two runs";
    EXPECT_TRUE(bitwise_equal(first[i], threaded[i])) << name << " output " << i << " differs with 2 threads";
  }
}

TEST(DeterminismTest, EveryOpRepeatsBitwise) {
  auto rng = make_rng(1100);
  // Shapes large enough that every op gives each of 2 threads more than the kernels' parallel grain (32768 elements
  // of work), so the threaded paths really run.
  const std::int64_t batch = 4, seq = 256, hidden = 128, heads = 8, kv = 2, d = 16, ffn = 160, vocab = 300;
  const std::int64_t T = batch * seq, qkv_w = (heads + 2 * kv) * d, flat = 200000;
  const FVec x = random_floats(rng, T * hidden), w = random_floats(rng, qkv_w * hidden), b = random_floats(rng, qkv_w);
  const FVec dy_qkv = random_floats(rng, T * qkv_w), gamma = random_floats(rng, hidden);
  const FVec beta = random_floats(rng, hidden);
  const FVec dy_h = random_floats(rng, T * hidden), qkv = random_floats(rng, T * qkv_w);
  const FVec dout = random_floats(rng, T * heads * d), gu = random_floats(rng, T * 2 * ffn);
  const FVec dy_f = random_floats(rng, T * ffn), logits = random_floats(rng, T * vocab, 3.0);
  const FVec big = random_floats(rng, flat), big_grad = random_floats(rng, flat);
  const IVec ids = random_ids(rng, T, vocab);
  const FVec table = random_floats(rng, vocab / 2 * hidden), pos = random_floats(rng, seq * hidden);

  expect_repeatable("linear", [&] {
    FVec y(T * qkv_w), dx(T * hidden), dw(w.size(), 0.0f), db(qkv_w, 0.0f);
    cpu::linear_forward({T, hidden, qkv_w}, x.data(), w.data(), b.data(), y.data());
    cpu::linear_backward({T, hidden, qkv_w}, dy_qkv.data(), x.data(), w.data(), dx.data(), dw.data(), db.data());
    return Outputs{y, dx, dw, db};
  });
  expect_repeatable("embedding", [&] {
    FVec out(T * hidden), dtable(vocab / 2 * hidden, 0.0f), dpos(seq * hidden, 0.0f);
    cpu::embedding_forward(T, hidden, ids.data(), table.data(), {vocab / 2, vocab}, out.data());
    cpu::embedding_backward(T, hidden, ids.data(), dy_h.data(), {vocab / 2, vocab}, dtable.data());
    cpu::position_embedding_forward(batch, seq, hidden, pos.data(), out.data());
    cpu::position_embedding_backward(batch, seq, hidden, dy_h.data(), dpos.data());
    return Outputs{out, dtable, dpos};
  });
  expect_repeatable("rope", [&] {
    FVec c(seq * d / 2), s(seq * d / 2), q = qkv;
    rope_table(10000.0, seq, d, c.data(), s.data());
    cpu::rope_forward({batch, seq, heads + kv, d, qkv_w}, c.data(), s.data(), q.data());
    FVec g = q;
    cpu::rope_backward({batch, seq, heads + kv, d, qkv_w}, c.data(), s.data(), g.data());
    return Outputs{q, g};
  });
  expect_repeatable("layernorm", [&] {
    FVec y(x.size()), mean(T), rstd(T), dx(x.size()), dg(hidden, 0.0f), dbt(hidden, 0.0f);
    cpu::layernorm_forward({T, hidden}, x.data(), gamma.data(), beta.data(), 1e-5f, y.data(), mean.data(), rstd.data());
    cpu::layernorm_backward({T, hidden}, x.data(), gamma.data(), mean.data(), rstd.data(), dy_h.data(), dx.data(),
                            dg.data(), dbt.data());
    return Outputs{y, mean, rstd, dx, dg, dbt};
  });
  expect_repeatable("rmsnorm", [&] {
    FVec y(x.size()), rstd(T), dx(x.size()), dg(hidden, 0.0f);
    cpu::rmsnorm_forward({T, hidden}, x.data(), gamma.data(), 1e-5f, y.data(), rstd.data());
    cpu::rmsnorm_backward({T, hidden}, x.data(), gamma.data(), rstd.data(), dy_h.data(), dx.data(), dg.data());
    return Outputs{y, rstd, dx, dg};
  });
  for (float p : {0.0f, 0.1f}) {
    expect_repeatable("attention", [&] {
      const AttentionShape s{batch, seq, heads, kv, d, qkv_w, qkv_w};
      const AttentionDropout drop{p, {3, 4, 5, DropoutSite::kAttentionProbs}, 0, 0, heads};
      FVec o(T * heads * d), lse(batch * heads * seq), dqkv(qkv.size());
      const float* q = qkv.data();
      cpu::attention_forward(s, q, q + heads * d, q + (heads + kv) * d, o.data(), lse.data(), &drop);
      cpu::attention_backward(s, q, q + heads * d, q + (heads + kv) * d, o.data(), lse.data(), dout.data(), dqkv.data(),
                              dqkv.data() + heads * d, dqkv.data() + (heads + kv) * d, &drop);
      return Outputs{o, lse, dqkv};
    });
  }
  expect_repeatable("activations", [&] {
    FVec y(T * ffn), dgu(gu.size()), g(gu.size()), dg(gu.size());
    cpu::swiglu_forward(T, ffn, gu.data(), y.data());
    cpu::swiglu_backward(T, ffn, gu.data(), dy_f.data(), dgu.data());
    cpu::gelu_forward(static_cast<std::int64_t>(gu.size()), gu.data(), g.data());
    cpu::gelu_backward(static_cast<std::int64_t>(gu.size()), gu.data(), gu.data(), dg.data());
    return Outputs{y, dgu, g, dg};
  });
  expect_repeatable("dropout_add", [&] {
    FVec out(x.size()), dx(x.size());
    const HiddenLayout l{batch, seq, hidden, 0, 0, seq};
    const DropoutKey key{1, 2, 3, DropoutSite::kMlpOutput};
    cpu::dropout_add_forward(l, x.data(), dy_h.data(), 0.1f, key, out.data());
    cpu::dropout_add_backward(l, dy_h.data(), 0.1f, key, dx.data());
    return Outputs{out, dx};
  });
  expect_repeatable("cross_entropy", [&] {
    FVec max(T), e(T), z(T), loss(T), dlogits(logits.size());
    const FVec dloss(T, 1.0f / T);
    const VocabShard all{0, vocab};
    cpu::cross_entropy_max(T, logits.data(), all, max.data());
    cpu::cross_entropy_sum_exp(T, logits.data(), ids.data(), all, max.data(), e.data(), z.data());
    const double mean = cpu::cross_entropy_loss(T, max.data(), e.data(), z.data(), loss.data());
    cpu::cross_entropy_backward(T, logits.data(), ids.data(), all, max.data(), e.data(), dloss.data(), dlogits.data());
    return Outputs{max, e, z, loss, dlogits, FVec{static_cast<float>(mean)}};
  });
  expect_repeatable("adamw", [&] {
    FVec p = big, m(flat, 0.0f), v(flat, 0.0f);
    const AdamWBuffer buf{p.data(), big_grad.data(), m.data(), v.data(), flat, true};
    const GradBuffer gb{big_grad.data(), flat};
    const double norm = cpu::grad_norm_squared(&gb, 1);
    cpu::adamw_step({1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 1.0}, &buf, 1);
    return Outputs{p, m, v, FVec{static_cast<float>(norm)}};
  });
}

}  // namespace
}  // namespace dtrain::kernels::testing
