// Casts, fills, bias, residual add and dropout, activations and RoPE on the GPU against the CPU backend and the host
// bf16 conversions.
#include "dtrain/kernels/cuda/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dtrain/kernels/activation.h"
#include "dtrain/kernels/cuda/activation.h"
#include "dtrain/kernels/cuda/dropout.h"
#include "dtrain/kernels/cuda/rope.h"
#include "dtrain/kernels/dropout.h"
#include "dtrain/kernels/rope.h"
#include "support.h"

namespace dtrain::kernels::cuda::testing {
namespace {

using ElementwiseTest = CudaTest;

TEST_F(ElementwiseTest, CastsRoundLikeTheHost) {
  auto rng = make_rng(51);
  FVec x = random_floats(rng, 5000, 100.0);
  const float inf = std::numeric_limits<float>::infinity();
  // Ties, overflow to infinity, infinities, the smallest normals and subnormals, signed zero.
  for (const float v : {1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-8f, std::numeric_limits<float>::max(), inf, -inf,
                        std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(), -0.0f}) {
    x.push_back(v);
  }
  const auto dx = to_device(ctx(), x);
  auto y = poisoned<bf16>(ctx(), x.size());
  cast_fp32_to_bf16(ctx(), static_cast<std::int64_t>(x.size()), dx.data(), y.data());
  const BVec got = to_host(ctx(), y);
  EXPECT_EQ(got, to_bf16_vec(x));  // __float2bfloat16 and the host's to_bf16: the same bits

  auto back = poisoned<float>(ctx(), x.size());
  cast_bf16_to_fp32(ctx(), static_cast<std::int64_t>(x.size()), y.data(), back.data());
  EXPECT_EQ(to_host(ctx(), back), from_bf16_vec(got));

  // A NaN stays a NaN (its payload may differ between host and device).
  const auto dnan = to_device(ctx(), FVec{std::numeric_limits<float>::quiet_NaN()});
  auto ynan = poisoned<bf16>(ctx(), 1);
  fill(ctx(), 1, 0.0f, ynan.data());
  cast_fp32_to_bf16(ctx(), 1, dnan.data(), ynan.data());
  EXPECT_TRUE(std::isnan(from_bf16(to_host(ctx(), ynan)[0])));
}

TEST_F(ElementwiseTest, FillBiasAddAndBiasGrad) {
  const std::int64_t rows = 150, cols = 33;
  auto f32 = poisoned<float>(ctx(), rows * cols);
  auto b16 = poisoned<bf16>(ctx(), rows * cols);
  fill(ctx(), rows * cols, 0.3f, f32.data());
  fill(ctx(), rows * cols, 0.3f, b16.data());
  EXPECT_EQ(to_host(ctx(), f32), FVec(rows * cols, 0.3f));
  EXPECT_EQ(to_host(ctx(), b16), BVec(rows * cols, to_bf16(0.3f)));

  auto rng = make_rng(52);
  const FVec bias = random_bf16_values(rng, cols);
  const auto dbias16 = to_device_bf16(ctx(), bias);
  const auto dbias32 = to_device(ctx(), bias);
  bias_add(ctx(), rows, cols, dbias16.data(), b16.data());
  bias_add(ctx(), rows, cols, dbias32.data(), f32.data());
  FVec expect32(rows * cols);
  for (std::int64_t i = 0; i < rows * cols; ++i) expect32[i] = 0.3f + bias[i % cols];
  EXPECT_EQ(to_host(ctx(), f32), expect32);
  FVec expect16(rows * cols);
  for (std::int64_t i = 0; i < rows * cols; ++i) expect16[i] = round_to_bf16(round_to_bf16(0.3f) + bias[i % cols]);
  EXPECT_EQ(to_host_float(ctx(), b16), expect16);

  const FVec dy = random_bf16_values(rng, rows * cols);
  const FVec db0 = random_floats(rng, cols);
  FVec expect_db(cols);
  for (std::int64_t c = 0; c < cols; ++c) {
    double s = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) s += dy[r * cols + c];
    expect_db[c] = static_cast<float>(db0[c] + s);
  }
  const auto ddy = to_device_bf16(ctx(), dy);
  auto db = to_device(ctx(), db0);
  bias_grad(ctx(), rows, cols, ddy.data(), db.data());
  EXPECT_LT(rel_error(to_host(ctx(), db), expect_db), kFp32Tolerance);
}

using DropoutTest = CudaTest;

TEST_F(DropoutTest, MasksAreTheCpuMasksBitForBit) {
  // A sequence-parallel slice of a micro-batch that is not the first: every index term of the global element matters.
  const HiddenLayout layout{2, 24, 40, 5, 8, 64};
  const DropoutKey key{0x1234'5678'9abcULL, 17, 3, DropoutSite::kMlpOutput};
  const float p = 0.3f;
  const std::int64_t n = layout.batch * layout.seq * layout.hidden;
  auto rng = make_rng(61);
  const FVec x = random_bf16_values(rng, n);
  const FVec residual = random_bf16_values(rng, n);
  FVec out_cpu(n), with_residual_cpu(n), dx_cpu(n);
  cpu::dropout_add_forward(layout, x.data(), nullptr, p, key, out_cpu.data());
  cpu::dropout_add_forward(layout, x.data(), residual.data(), p, key, with_residual_cpu.data());
  cpu::dropout_add_backward(layout, x.data(), p, key, dx_cpu.data());

  const auto dx_in = to_device_bf16(ctx(), x), dres = to_device_bf16(ctx(), residual);
  auto out = poisoned<bf16>(ctx(), n), with_residual = poisoned<bf16>(ctx(), n), dx = poisoned<bf16>(ctx(), n);
  dropout_add_forward(ctx(), layout, dx_in.data(), nullptr, p, key, out.data());
  dropout_add_forward(ctx(), layout, dx_in.data(), dres.data(), p, key, with_residual.data());
  dropout_add_backward(ctx(), layout, dx_in.data(), p, key, dx.data());
  const FVec got = to_host_float(ctx(), out);
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i] == 0.0f, out_cpu[i] == 0.0f) << "mask differs at element " << i;
    dropped += out_cpu[i] == 0.0f ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(n), p, 0.05);
  EXPECT_EQ(got, round_bf16(out_cpu));  // x * (1 / (1 - p)) in fp32, rounded once
  // residual + x * scale: nvcc may fuse it into one FMA (rounded once in fp32, the CPU rounds twice).
  EXPECT_LT(rel_error(to_host_float(ctx(), with_residual), with_residual_cpu), kBf16Tolerance);
  EXPECT_EQ(to_host_float(ctx(), dx), round_bf16(dx_cpu));
}

TEST_F(DropoutTest, ResidualAddAndZeroProbability) {
  const std::int64_t n = 1000;
  auto rng = make_rng(62);
  const FVec a = random_bf16_values(rng, n), b = random_bf16_values(rng, n);
  FVec sum(n);
  for (std::int64_t i = 0; i < n; ++i) sum[i] = round_to_bf16(a[i] + b[i]);
  const auto da = to_device_bf16(ctx(), a), db = to_device_bf16(ctx(), b);
  auto out = poisoned<bf16>(ctx(), n);
  residual_add(ctx(), n, da.data(), db.data(), out.data());
  EXPECT_EQ(to_host_float(ctx(), out), sum);
  const HiddenLayout layout{1, 10, 100, 0, 0, 10};
  auto out0 = poisoned<bf16>(ctx(), n);
  dropout_add_forward(ctx(), layout, da.data(), db.data(), 0.0f, DropoutKey{}, out0.data());
  EXPECT_EQ(to_host_float(ctx(), out0), sum);
}

using ActivationTest = CudaTest;

TEST_F(ActivationTest, GeluAndSwigluMatchCpu) {
  const std::int64_t tokens = 33, ffn = 70;
  auto rng = make_rng(71);
  const FVec x = random_bf16_values(rng, tokens * ffn, 2.0);
  const FVec gate_up = random_bf16_values(rng, tokens * 2 * ffn, 2.0);
  const FVec dy = random_bf16_values(rng, tokens * ffn);
  FVec gelu_cpu(x.size()), dgelu_cpu(x.size()), swiglu_cpu(tokens * ffn), dswiglu_cpu(gate_up.size());
  cpu::gelu_forward(tokens * ffn, x.data(), gelu_cpu.data());
  cpu::gelu_backward(tokens * ffn, x.data(), dy.data(), dgelu_cpu.data());
  cpu::swiglu_forward(tokens, ffn, gate_up.data(), swiglu_cpu.data());
  cpu::swiglu_backward(tokens, ffn, gate_up.data(), dy.data(), dswiglu_cpu.data());

  const auto dx_in = to_device_bf16(ctx(), x), dgu = to_device_bf16(ctx(), gate_up), ddy = to_device_bf16(ctx(), dy);
  auto y = poisoned<bf16>(ctx(), x.size());
  gelu_forward(ctx(), tokens * ffn, dx_in.data(), y.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), y), gelu_cpu), kBf16Tolerance);
  auto dgrad = to_device_bf16(ctx(), dy);
  gelu_backward(ctx(), tokens * ffn, dx_in.data(), dgrad.data(), dgrad.data());  // dx aliases dy
  EXPECT_LT(rel_error(to_host_float(ctx(), dgrad), dgelu_cpu), kBf16Tolerance);
  auto sy = poisoned<bf16>(ctx(), tokens * ffn);
  swiglu_forward(ctx(), tokens, ffn, dgu.data(), sy.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), sy), swiglu_cpu), kBf16Tolerance);
  auto dgate_up = poisoned<bf16>(ctx(), gate_up.size());
  swiglu_backward(ctx(), tokens, ffn, dgu.data(), ddy.data(), dgate_up.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), dgate_up), dswiglu_cpu), kBf16Tolerance);
}

using RopeTest = CudaTest;

TEST_F(RopeTest, RotatesInsideAFusedRowLikeTheCpu) {
  // Keys of a fused QKV row: 3 kv heads of 32 starting after 6 query heads; the other columns must stay untouched.
  const std::int64_t batch = 2, seq = 50, d = 32, heads = 3, q_width = 6 * d, stride = q_width + 2 * heads * d;
  const RopeShape shape{batch, seq, heads, d, stride};
  FVec cos_table(seq * d / 2), sin_table(seq * d / 2);
  rope_table(10000.0, seq, d, cos_table.data(), sin_table.data());
  auto rng = make_rng(81);
  const FVec rows = random_bf16_values(rng, batch * seq * stride);
  FVec fwd_cpu = rows, bwd_cpu = rows;
  cpu::rope_forward(shape, cos_table.data(), sin_table.data(), fwd_cpu.data() + q_width);
  cpu::rope_backward(shape, cos_table.data(), sin_table.data(), bwd_cpu.data() + q_width);
  const auto dcos = to_device(ctx(), cos_table), dsin = to_device(ctx(), sin_table);
  auto fwd = to_device_bf16(ctx(), rows), bwd = to_device_bf16(ctx(), rows);
  rope_forward(ctx(), shape, dcos.data(), dsin.data(), fwd.data() + q_width);
  rope_backward(ctx(), shape, dcos.data(), dsin.data(), bwd.data() + q_width);
  const FVec got_fwd = to_host_float(ctx(), fwd), got_bwd = to_host_float(ctx(), bwd);
  EXPECT_LT(rel_error(got_fwd, fwd_cpu), kBf16Tolerance);
  EXPECT_LT(rel_error(got_bwd, bwd_cpu), kBf16Tolerance);
  for (std::int64_t t = 0; t < batch * seq; ++t) {
    for (std::int64_t c = 0; c < q_width; ++c) ASSERT_EQ(got_fwd[t * stride + c], rows[t * stride + c]);
    for (std::int64_t c = q_width + heads * d; c < stride; ++c)
      ASSERT_EQ(got_bwd[t * stride + c], rows[t * stride + c]);
  }
}

// The memory-bound maps take 16-byte accesses where every pointer is aligned and the rows are multiples of 8, one
// element a thread otherwise: both paths must give the same bits. Each kernel runs on inputs placed at the start of a
// buffer (aligned: the vector path) and one element further on (misaligned: the scalar path).
class VectorPaths : public CudaTest {
 protected:
  // The values of `host` in a device buffer at element `offset`, with room for one more element.
  template <typename T>
  DeviceBuffer<T> placed(const std::vector<T>& host, std::size_t offset) {
    DeviceBuffer<T> d = poisoned<T>(ctx(), host.size() + 1);
    copy_to_device(ctx(), d.data() + offset, host.data(), host.size() * sizeof(T));
    return d;
  }
  template <typename T>
  std::vector<T> read(const DeviceBuffer<T>& d, std::size_t offset, std::size_t n) {
    std::vector<T> host(n);
    copy_to_host(ctx(), host.data(), d.data() + offset, n * sizeof(T));
    return host;
  }
};

TEST_F(VectorPaths, SwigluResidualCastAndFillGiveTheSameBitsOnBothPaths) {
  const std::int64_t tokens = 37, ffn = 96;
  auto rng = make_rng(91);
  const BVec gate_up = to_bf16_vec(random_bf16_values(rng, tokens * 2 * ffn, 3.0));
  const BVec dy = to_bf16_vec(random_bf16_values(rng, tokens * ffn));
  const FVec x32 = random_floats(rng, static_cast<std::size_t>(tokens * ffn), 50.0);
  std::vector<BVec> y(2), dgu(2), sum(2), cast(2);
  std::vector<FVec> filled(2);
  for (std::size_t o : {0, 1}) {
    const auto dgate_up = placed(gate_up, o), ddy = placed(dy, o);
    auto out = placed(BVec(tokens * ffn), o), dout = placed(BVec(gate_up.size()), o);
    swiglu_forward(ctx(), tokens, ffn, dgate_up.data() + o, out.data() + o);
    swiglu_backward(ctx(), tokens, ffn, dgate_up.data() + o, ddy.data() + o, dout.data() + o);
    y[o] = read(out, o, tokens * ffn);
    dgu[o] = read(dout, o, gate_up.size());
    residual_add(ctx(), tokens * ffn, out.data() + o, ddy.data() + o, out.data() + o);  // in place, as the layers do
    sum[o] = read(out, o, tokens * ffn);
    const auto dx32 = placed(x32, o);
    auto b = placed(BVec(x32.size()), o);
    cast_fp32_to_bf16(ctx(), static_cast<std::int64_t>(x32.size()), dx32.data() + o, b.data() + o);
    cast[o] = read(b, o, x32.size());
    auto f = placed(FVec(x32.size()), o);
    fill(ctx(), static_cast<std::int64_t>(x32.size()), -1.25f, f.data() + o);
    filled[o] = read(f, o, x32.size());
  }
  EXPECT_EQ(y[0], y[1]);
  EXPECT_EQ(dgu[0], dgu[1]);
  EXPECT_EQ(sum[0], sum[1]);
  EXPECT_EQ(cast[0], cast[1]);
  EXPECT_EQ(cast[0], to_bf16_vec(x32));
  EXPECT_EQ(filled[0], FVec(x32.size(), -1.25f));
  EXPECT_EQ(filled[1], filled[0]);
  // And against the CPU kernels (the scalar path was checked against them above at other sizes).
  FVec y_cpu(tokens * ffn);
  cpu::swiglu_forward(tokens, ffn, from_bf16_vec(gate_up).data(), y_cpu.data());
  EXPECT_LT(rel_error(from_bf16_vec(y[0]), y_cpu), kBf16Tolerance);
}

TEST_F(VectorPaths, RopeGivesTheSameBitsOnBothPaths) {
  // Query heads of a fused QKV row of Llama's head size, 4 heads of 128.
  const std::int64_t batch = 2, seq = 24, d = 128, heads = 4, stride = 3 * heads * d;
  const RopeShape shape{batch, seq, heads, d, stride};
  FVec cos_table(seq * d / 2), sin_table(seq * d / 2);
  rope_table(500000.0, seq, d, cos_table.data(), sin_table.data());
  auto rng = make_rng(92);
  const BVec rows = to_bf16_vec(random_bf16_values(rng, batch * seq * stride));
  std::vector<BVec> fwd(2), bwd(2);
  for (std::size_t o : {0, 1}) {
    const auto dcos = placed(cos_table, o), dsin = placed(sin_table, o);
    auto f = placed(rows, o), b = placed(rows, o);
    rope_forward(ctx(), shape, dcos.data() + o, dsin.data() + o, f.data() + o);
    rope_backward(ctx(), shape, dcos.data() + o, dsin.data() + o, b.data() + o);
    fwd[o] = read(f, o, rows.size());
    bwd[o] = read(b, o, rows.size());
  }
  EXPECT_EQ(fwd[0], fwd[1]);
  EXPECT_EQ(bwd[0], bwd[1]);
  FVec fwd_cpu = from_bf16_vec(rows);
  cpu::rope_forward(shape, cos_table.data(), sin_table.data(), fwd_cpu.data());
  EXPECT_LT(rel_error(from_bf16_vec(fwd[0]), fwd_cpu), kBf16Tolerance);
}

}  // namespace
}  // namespace dtrain::kernels::cuda::testing
