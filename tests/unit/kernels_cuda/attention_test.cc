// Fused causal attention on the GPU against the CPU backend's, with q, k, v inside one fused QKV buffer as the
// projection produces them, grouped-query heads, sequence lengths that are not multiples of the 64-row tiles, and
// dropout on the probabilities (whose masks must be the CPU's).
#include "dtrain/kernels/cuda/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/kernels/attention.h"
#include "support.h"

namespace dtrain::kernels::cuda::testing {
namespace {

struct AttentionCase {
  std::int64_t batch, seq, heads, kv_heads, d;
  float dropout;
};

std::string describe(const AttentionCase& c) {
  return "b" + std::to_string(c.batch) + "_s" + std::to_string(c.seq) + "_h" + std::to_string(c.heads) + "_kv" +
         std::to_string(c.kv_heads) + "_d" + std::to_string(c.d) + (c.dropout > 0 ? "_dropout" : "");
}

std::string case_name(const ::testing::TestParamInfo<AttentionCase>& info) { return describe(info.param); }

// Shown by gtest (and in ctest's test names) instead of the parameter's bytes.
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << describe(c); }

class AttentionTest : public CudaTest, public ::testing::WithParamInterface<AttentionCase> {};

// Columns [offset, offset + width) of every row of a [rows, stride] buffer.
FVec columns(const FVec& x, std::int64_t rows, std::int64_t stride, std::int64_t offset, std::int64_t width) {
  FVec out(rows * width);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + r * stride + offset, width, out.begin() + r * width);
  }
  return out;
}

TEST_P(AttentionTest, ForwardAndBackwardMatchCpu) {
  const AttentionCase c = GetParam();
  const std::int64_t tokens = c.batch * c.seq, qw = c.heads * c.d, kw = c.kv_heads * c.d, stride = qw + 2 * kw;
  const AttentionShape s{c.batch, c.seq, c.heads, c.kv_heads, c.d, stride, stride};
  auto rng = make_rng(900 + c.seq + c.d);
  const FVec qkv = random_bf16_values(rng, tokens * stride);
  const FVec dout = random_bf16_values(rng, tokens * qw);
  const AttentionDropout drop{c.dropout, DropoutKey{99, 4, 2, DropoutSite::kAttentionProbs}, 3, 1, c.heads + 2};
  const AttentionDropout* dropout = c.dropout > 0 ? &drop : nullptr;

  const auto dqkv_in = to_device_bf16(ctx(), qkv);
  const auto ddout = to_device_bf16(ctx(), dout);
  auto o = poisoned<bf16>(ctx(), tokens * qw);
  auto lse = poisoned<float>(ctx(), c.batch * c.heads * c.seq);
  const bf16* q = dqkv_in.data();
  attention_forward(ctx(), s, q, q + qw, q + qw + kw, o.data(), lse.data(), dropout);
  // Gradients into one fused buffer; the poison must be overwritten everywhere.
  auto dqkv = poisoned<bf16>(ctx(), tokens * stride);
  attention_backward(ctx(), s, q, q + qw, q + qw + kw, o.data(), lse.data(), ddout.data(), dqkv.data(),
                     dqkv.data() + qw, dqkv.data() + qw + kw, dropout);
  const FVec o_gpu = to_host_float(ctx(), o);
  const FVec lse_gpu = to_host(ctx(), lse);
  const FVec grads = to_host_float(ctx(), dqkv);

  FVec o_cpu(tokens * qw), lse_cpu(lse_gpu.size());
  cpu::attention_forward(s, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw, o_cpu.data(), lse_cpu.data(), dropout);
  EXPECT_LT(rel_error(o_gpu, o_cpu), kBf16Tolerance);
  // lse from identical inputs: fp32 sums of up to seq exponentials in a different order, and expf vs the CPU's exp.
  EXPECT_LT(rel_error(lse_gpu, lse_cpu), 1e-4);

  // The CPU backward gets the GPU's bf16 O, so that D = dO . O is computed from the same values on both sides and
  // only the final rounding of dq, dk, dv (and summation order) separates them.
  FVec grads_cpu(tokens * stride, 0.0f);
  cpu::attention_backward(s, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw, o_gpu.data(), lse_gpu.data(),
                          dout.data(), grads_cpu.data(), grads_cpu.data() + qw, grads_cpu.data() + qw + kw, dropout);
  EXPECT_LT(rel_error(columns(grads, tokens, stride, 0, qw), columns(grads_cpu, tokens, stride, 0, qw)), kBf16Tolerance)
      << "dq";
  EXPECT_LT(rel_error(columns(grads, tokens, stride, qw, kw), columns(grads_cpu, tokens, stride, qw, kw)),
            kBf16Tolerance)
      << "dk";
  EXPECT_LT(rel_error(columns(grads, tokens, stride, qw + kw, kw), columns(grads_cpu, tokens, stride, qw + kw, kw)),
            kBf16Tolerance)
      << "dv";
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttentionCase{2, 64, 4, 2, 16, 0.0f},    // one tile, GQA 2:1
                                           AttentionCase{1, 200, 4, 4, 64, 0.0f},   // partial last tile, MHA
                                           AttentionCase{2, 130, 8, 1, 32, 0.0f},   // multi-query, 3 tiles
                                           AttentionCase{1, 129, 2, 1, 128, 0.0f},  // largest head, 1 row past
                                           AttentionCase{3, 1, 2, 1, 64, 0.0f},     // one token
                                           AttentionCase{2, 100, 4, 2, 64, 0.1f},   // dropout
                                           AttentionCase{1, 150, 2, 2, 32, 0.5f}),  // heavy dropout, 3 tiles
                         case_name);

using AttentionShapeTest = CudaTest;

TEST_F(AttentionShapeTest, UnsupportedHeadDimIsAnInputError) {
  EXPECT_FALSE(attention_supports_head_dim(24));
  EXPECT_TRUE(attention_supports_head_dim(128));
  const AttentionShape s{1, 8, 2, 1, 24, 4 * 24, 4 * 24};
  auto x = poisoned<bf16>(ctx(), 8 * 4 * 24);
  auto lse = poisoned<float>(ctx(), 16);
  try {
    attention_forward(ctx(), s, x.data(), x.data(), x.data(), x.data(), lse.data(), nullptr);
    FAIL() << "head_dim 24 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_NE(std::string(e.what()).find("head_dim = 24"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtrain::kernels::cuda::testing
