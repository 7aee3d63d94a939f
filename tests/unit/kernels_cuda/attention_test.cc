// Fused causal attention on the GPU against the CPU backend's, with q, k, v inside one fused QKV buffer as the
// projection produces them, grouped-query heads, sequence lengths that are not multiples of the tiles (64 and 128
// rows), and dropout on the probabilities (whose masks must be the CPU's). Both implementations are checked (the
// fp32 "simt" kernels and the tensor-core "mma" ones, picked with AttentionKernel), and the tensor-core path is also
// checked for bitwise repeatability and against the fp32 path.
#include "dtrain/kernels/cuda/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/kernels/attention.h"
#include "support.h"

namespace dtrain::kernels::cuda::testing {
namespace {

const char* kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kAuto:
      return "auto";
    case AttentionKernel::kSimt:
      return "simt";
    case AttentionKernel::kMma:
      return "mma";
  }
  return "?";
}

struct AttentionCase {
  AttentionKernel kernel;
  std::int64_t batch, seq, heads, kv_heads, d;
  float dropout;
};

std::string describe(const AttentionCase& c) {
  return std::string(kernel_name(c.kernel)) + "_b" + std::to_string(c.batch) + "_s" + std::to_string(c.seq) + "_h" +
         std::to_string(c.heads) + "_kv" + std::to_string(c.kv_heads) + "_d" + std::to_string(c.d) +
         (c.dropout > 0 ? "_dropout" : "");
}

std::string case_name(const ::testing::TestParamInfo<AttentionCase>& info) { return describe(info.param); }

// Shown by gtest (and in ctest's test names) instead of the parameter's bytes.
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << describe(c); }

// Columns [offset, offset + width) of every row of a [rows, stride] buffer.
FVec columns(const FVec& x, std::int64_t rows, std::int64_t stride, std::int64_t offset, std::int64_t width) {
  FVec out(rows * width);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + r * stride + offset, width, out.begin() + r * width);
  }
  return out;
}

// Random bf16 inputs of one case: the fused QKV activation [tokens, (heads + 2 kv_heads) d] and dO [tokens, heads d].
struct Inputs {
  AttentionShape shape;
  std::int64_t tokens, qw, kw, stride;
  FVec qkv, dout;
};

Inputs make_inputs(const AttentionCase& c) {
  Inputs in;
  in.tokens = c.batch * c.seq;
  in.qw = c.heads * c.d;
  in.kw = c.kv_heads * c.d;
  in.stride = in.qw + 2 * in.kw;
  in.shape = AttentionShape{c.batch, c.seq, c.heads, c.kv_heads, c.d, in.stride, in.stride};
  auto rng = make_rng(900 + c.seq + c.d);
  in.qkv = random_bf16_values(rng, in.tokens * in.stride);
  in.dout = random_bf16_values(rng, in.tokens * in.qw);
  return in;
}

// What one forward and backward on the GPU gave: O, lse and the gradients in one fused d(QKV) buffer, as stored.
struct Outputs {
  BVec o;
  FVec lse;
  BVec dqkv;
};

Outputs run_gpu(Context& ctx, const Inputs& in, AttentionKernel kernel, const AttentionDropout* dropout) {
  const AttentionShape& s = in.shape;
  const auto dqkv_in = to_device_bf16(ctx, in.qkv);
  const auto ddout = to_device_bf16(ctx, in.dout);
  // Every output starts as NaNs: an element the kernels never write shows up in the comparisons.
  auto o = poisoned<bf16>(ctx, in.tokens * in.qw);
  auto lse = poisoned<float>(ctx, s.batch * s.n_heads * s.seq);
  auto dqkv = poisoned<bf16>(ctx, in.tokens * in.stride);
  const bf16* q = dqkv_in.data();
  attention_forward(ctx, s, q, q + in.qw, q + in.qw + in.kw, o.data(), lse.data(), dropout, kernel);
  attention_backward(ctx, s, q, q + in.qw, q + in.qw + in.kw, o.data(), lse.data(), ddout.data(), dqkv.data(),
                     dqkv.data() + in.qw, dqkv.data() + in.qw + in.kw, dropout, kernel);
  return Outputs{to_host(ctx, o), to_host(ctx, lse), to_host(ctx, dqkv)};
}

class AttentionTest : public CudaTest, public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(AttentionTest, ForwardAndBackwardMatchCpu) {
  const AttentionCase c = GetParam();
  const Inputs in = make_inputs(c);
  const AttentionShape& s = in.shape;
  const std::int64_t tokens = in.tokens, qw = in.qw, kw = in.kw, stride = in.stride;
  const AttentionDropout drop{c.dropout, DropoutKey{99, 4, 2, DropoutSite::kAttentionProbs}, 3, 1, c.heads + 2};
  const AttentionDropout* dropout = c.dropout > 0 ? &drop : nullptr;

  const Outputs gpu = run_gpu(ctx(), in, c.kernel, dropout);
  const FVec o_gpu = from_bf16_vec(gpu.o);
  const FVec& lse_gpu = gpu.lse;
  const FVec grads = from_bf16_vec(gpu.dqkv);

  const FVec& qkv = in.qkv;
  FVec o_cpu(tokens * qw), lse_cpu(lse_gpu.size());
  cpu::attention_forward(s, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw, o_cpu.data(), lse_cpu.data(), dropout);
  EXPECT_LT(rel_error(o_gpu, o_cpu), kBf16Tolerance);
  // lse from identical inputs: fp32 sums of up to seq exponentials in a different order, and expf (exp2f with the
  // scale folded in, on the tensor-core path) vs the CPU's exp.
  EXPECT_LT(rel_error(lse_gpu, lse_cpu), 1e-4);

  // The CPU backward gets the GPU's bf16 O, so that D = dO . O is computed from the same values on both sides and
  // only the final rounding of dq, dk, dv (and summation order) separates them (on the tensor-core path also the bf16
  // rounding of P and dS before their products).
  FVec grads_cpu(tokens * stride, 0.0f);
  cpu::attention_backward(s, qkv.data(), qkv.data() + qw, qkv.data() + qw + kw, o_gpu.data(), lse_gpu.data(),
                          in.dout.data(), grads_cpu.data(), grads_cpu.data() + qw, grads_cpu.data() + qw + kw, dropout);
  const FVec dv = columns(grads, tokens, stride, qw + kw, kw);
  if (s.seq == 1) {
    // One token attends only to itself: P = 1 and O = V, so dP = dO . V = D and dS = P (dP - D) is zero. dq and dk
    // are then both sides' rounding noise (dP and D summed in different orders), with no relative error to compare:
    // check that they are noise, far below the gradients that flow (dv = dO).
    auto norm = [](const FVec& x) {
      double sum = 0;
      for (float e : x) sum += static_cast<double>(e) * e;
      return std::sqrt(sum);
    };
    EXPECT_LT(norm(columns(grads, tokens, stride, 0, qw)), 1e-3 * norm(dv)) << "dq";
    EXPECT_LT(norm(columns(grads, tokens, stride, qw, kw)), 1e-3 * norm(dv)) << "dk";
  } else {
    EXPECT_LT(rel_error(columns(grads, tokens, stride, 0, qw), columns(grads_cpu, tokens, stride, 0, qw)),
              kBf16Tolerance)
        << "dq";
    EXPECT_LT(rel_error(columns(grads, tokens, stride, qw, kw), columns(grads_cpu, tokens, stride, qw, kw)),
              kBf16Tolerance)
        << "dk";
  }
  EXPECT_LT(rel_error(dv, columns(grads_cpu, tokens, stride, qw + kw, kw)), kBf16Tolerance) << "dv";
}

constexpr auto kSimt = AttentionKernel::kSimt;
constexpr auto kMma = AttentionKernel::kMma;
constexpr auto kAuto = AttentionKernel::kAuto;

INSTANTIATE_TEST_SUITE_P(Simt, AttentionTest,
                         ::testing::Values(AttentionCase{kSimt, 2, 64, 4, 2, 16, 0.0f},    // one tile, GQA 2:1
                                           AttentionCase{kSimt, 1, 200, 4, 4, 64, 0.0f},   // partial last tile, MHA
                                           AttentionCase{kSimt, 2, 130, 8, 1, 32, 0.0f},   // multi-query, 3 tiles
                                           AttentionCase{kSimt, 1, 129, 2, 1, 128, 0.0f},  // largest head, 1 row past
                                           AttentionCase{kSimt, 3, 1, 2, 1, 64, 0.0f},     // one token
                                           AttentionCase{kSimt, 2, 100, 4, 2, 64, 0.1f},   // dropout
                                           AttentionCase{kSimt, 1, 150, 2, 2, 32, 0.5f}),  // heavy dropout, 3 tiles
                         case_name);

// The tensor-core kernels' blocks are 128 query rows (forward, dQ) and 128 keys (dK/dV) with 64-key and 32- or
// 64-query tiles: the shapes cross those boundaries, end inside them, and fill them exactly.
INSTANTIATE_TEST_SUITE_P(Mma, AttentionTest,
                         ::testing::Values(AttentionCase{kMma, 2, 200, 8, 2, 64, 0.0f},   // GQA 4:1, partial tiles
                                           AttentionCase{kMma, 2, 130, 8, 2, 128, 0.0f},  // GQA 4:1, 2 rows past 128
                                           AttentionCase{kMma, 1, 300, 4, 4, 128, 0.0f},  // MHA, 3 blocks of 128
                                           AttentionCase{kMma, 2, 256, 4, 1, 64, 0.0f},   // multi-query, whole blocks
                                           AttentionCase{kMma, 1, 64, 2, 1, 64, 0.0f},    // one key tile exactly
                                           AttentionCase{kMma, 3, 1, 2, 1, 128, 0.0f}),   // one token
                         case_name);

// kAuto: the tensor cores where they apply (head_dim 128), the fp32 kernels where they do not (dropout, head_dim 32),
// unless DTRAIN_ATTENTION_KERNEL=simt; the results match the CPU either way.
INSTANTIATE_TEST_SUITE_P(Auto, AttentionTest,
                         ::testing::Values(AttentionCase{kAuto, 1, 129, 4, 1, 128, 0.0f},
                                           AttentionCase{kAuto, 2, 100, 4, 2, 64, 0.1f},
                                           AttentionCase{kAuto, 1, 70, 2, 2, 32, 0.0f}),
                         case_name);

using AttentionMmaTest = CudaTest;

// Two runs of the tensor-core path give the same bytes: every output element has one writer and a fixed summation
// order (no atomics), so nothing depends on how the blocks were scheduled.
TEST_F(AttentionMmaTest, BitwiseRepeatable) {
  for (const AttentionCase& c :
       {AttentionCase{kMma, 2, 300, 8, 2, 128, 0.0f}, AttentionCase{kMma, 2, 200, 4, 1, 64, 0.0f}}) {
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c);
    const Outputs first = run_gpu(ctx(), in, kMma, nullptr);
    const Outputs second = run_gpu(ctx(), in, kMma, nullptr);
    ASSERT_EQ(first.o.size(), second.o.size());
    ASSERT_EQ(first.lse.size(), second.lse.size());
    ASSERT_EQ(first.dqkv.size(), second.dqkv.size());
    EXPECT_EQ(std::memcmp(first.o.data(), second.o.data(), first.o.size() * sizeof(bf16)), 0) << "o";
    EXPECT_EQ(std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * sizeof(float)), 0) << "lse";
    EXPECT_EQ(std::memcmp(first.dqkv.data(), second.dqkv.data(), first.dqkv.size() * sizeof(bf16)), 0) << "dq, dk, dv";
  }
}

// The two implementations agree within bf16 rounding (each output rounded once, plus the tensor-core path's bf16 P and
// dS): a relative 2-norm error under kBf16Tolerance on o, dq, dk and dv, and fp32 agreement on lse.
TEST_F(AttentionMmaTest, AgreesWithSimt) {
  for (const AttentionCase& c :
       {AttentionCase{kMma, 2, 300, 8, 2, 128, 0.0f}, AttentionCase{kMma, 2, 200, 8, 2, 64, 0.0f}}) {
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c);
    const Outputs mma = run_gpu(ctx(), in, kMma, nullptr);
    const Outputs simt = run_gpu(ctx(), in, kSimt, nullptr);
    EXPECT_LT(rel_error(from_bf16_vec(mma.o), from_bf16_vec(simt.o)), kBf16Tolerance) << "o";
    EXPECT_LT(rel_error(mma.lse, simt.lse), 1e-4) << "lse";
    const FVec a = from_bf16_vec(mma.dqkv);
    const FVec b = from_bf16_vec(simt.dqkv);
    EXPECT_LT(rel_error(columns(a, in.tokens, in.stride, 0, in.qw), columns(b, in.tokens, in.stride, 0, in.qw)),
              kBf16Tolerance)
        << "dq";
    EXPECT_LT(rel_error(columns(a, in.tokens, in.stride, in.qw, in.kw), columns(b, in.tokens, in.stride, in.qw, in.kw)),
              kBf16Tolerance)
        << "dk";
    EXPECT_LT(rel_error(columns(a, in.tokens, in.stride, in.qw + in.kw, in.kw),
                        columns(b, in.tokens, in.stride, in.qw + in.kw, in.kw)),
              kBf16Tolerance)
        << "dv";
  }
}

// Asking for the tensor cores where they do not apply is an input error that says what they need.
TEST_F(AttentionMmaTest, UnsupportedShapeIsAnInputError) {
  const AttentionShape s32{1, 8, 2, 1, 32, 4 * 32, 4 * 32};
  auto x = poisoned<bf16>(ctx(), 8 * 4 * 128);
  auto lse = poisoned<float>(ctx(), 16);
  const AttentionDropout drop{0.1f, DropoutKey{1, 0, 0, DropoutSite::kAttentionProbs}, 0, 0, 2};
  const AttentionShape s64{1, 8, 2, 1, 64, 4 * 64, 4 * 64};
  const auto expect_input_error = [&](const AttentionShape& s, const AttentionDropout* dropout, const char* what) {
    try {
      attention_forward(ctx(), s, x.data(), x.data(), x.data(), x.data(), lse.data(), dropout, kMma);
      FAIL() << what << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInput) << what;
      EXPECT_NE(std::string(e.what()).find("head_dim 64 or 128"), std::string::npos) << e.what();
    }
  };
  expect_input_error(s32, nullptr, "head_dim 32");
  expect_input_error(s64, &drop, "dropout");
}

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
