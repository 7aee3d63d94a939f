// FP8 on the GPU (dtrain/kernels/cuda/fp8.h) against the CPU's emulation (dtrain/kernels/fp8.h): the amax, the casts
// (every byte the CPU's rounding, transposed and padded where asked) and cuBLASLt's FP8 GEMMs, which multiply the same
// FP8 values as the CPU's fp32 GEMM over the dequantised operands: only the summation order differs.
#include "dtrain/kernels/cuda/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "dtrain/common/error.h"
#include "dtrain/kernels/fp8.h"
#include "dtrain/kernels/linear.h"
#include "support.h"

namespace dtrain::kernels::cuda::testing {
namespace {

using Fp8Test = CudaTest;

// The byte of round_to_fp8(v): E4M3 (bias 7) or E5M2 (bias 15), decoded by search over the 256 patterns.
float decode(std::uint8_t b, Fp8Kind kind) {
  const bool e4m3 = kind == Fp8Kind::kE4M3;
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int exp = (b >> mbits) & ((1 << (7 - mbits)) - 1), man = b & ((1 << mbits) - 1);
  const double frac = static_cast<double>(man) / (1 << mbits);
  const double v = exp == 0 ? frac * std::ldexp(1.0, 1 - bias) : (1 + frac) * std::ldexp(1.0, exp - bias);
  return static_cast<float>((b & 0x80) ? -v : v);
}

TEST_F(Fp8Test, AmaxAndCastsAreTheCpusRounding) {
  const std::int64_t rows = 37, cols = 48, ld = 48;
  auto rng = make_rng(21);
  FVec x = random_bf16_values(rng, rows * cols, 0.05);
  x[100] = -0.75f;
  const auto xd = to_device_bf16(ctx(), x);
  auto amax = poisoned<float>(ctx(), 1);
  fp8_amax(ctx(), rows * cols, xd.data(), amax.data());
  EXPECT_EQ(to_host(ctx(), amax)[0], 0.75f);
  for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
    auto q = poisoned<std::uint8_t>(ctx(), rows * cols);
    auto qt = poisoned<std::uint8_t>(ctx(), cols * ld);
    auto descale = poisoned<float>(ctx(), 1);
    fp8_cast(ctx(), rows, cols, xd.data(), amax.data(), kind, q.data(), qt.data(), ld, descale.data());
    const float scale = fp8_scale(0.75f, kind);
    EXPECT_EQ(to_host(ctx(), descale)[0], 1.0f / scale);
    const auto hq = to_host(ctx(), q), hqt = to_host(ctx(), qt);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const float want = round_to_fp8(x[r * cols + c] * scale, kind);
        ASSERT_EQ(decode(hq[r * cols + c], kind), want) << r << " " << c;
        ASSERT_EQ(decode(hqt[c * ld + r], kind), want) << r << " " << c;
      }
      for (std::int64_t c = 0; c < cols; ++c) {
        for (std::int64_t p = rows; p < ld; ++p) ASSERT_EQ(hqt[c * ld + p], 0) << "padding";
      }
    }
  }
}

// y [n, m] = A [m, k] . B [n, k]^T in FP8 (E4M3 x E5M2, the backward's pairing) against the CPU's GEMM over the
// dequantised values: bf16 out and fp32 accumulated.
TEST_F(Fp8Test, GemmsEqualTheCpuGemmOverTheDequantisedOperands) {
  const std::int64_t m = 96, n = 40, k = 64;
  auto rng = make_rng(22);
  const FVec a = random_bf16_values(rng, m * k, 0.1), b = random_bf16_values(rng, n * k, 2.0);
  const auto ad = to_device_bf16(ctx(), a), bd = to_device_bf16(ctx(), b);
  auto amax = allocate<float>(ctx(), 2);
  auto descale = allocate<float>(ctx(), 2);
  auto qa = allocate<std::uint8_t>(ctx(), m * k), qb = allocate<std::uint8_t>(ctx(), n * k);
  fp8_amax(ctx(), m * k, ad.data(), amax.data());
  fp8_amax(ctx(), n * k, bd.data(), amax.data() + 1);
  fp8_cast(ctx(), m, k, ad.data(), amax.data(), Fp8Kind::kE4M3, qa.data(), nullptr, 0, descale.data());
  fp8_cast(ctx(), n, k, bd.data(), amax.data() + 1, Fp8Kind::kE5M2, qb.data(), nullptr, 0, descale.data() + 1);
  auto y = poisoned<bf16>(ctx(), n * m);
  const Fp8Operand oa{qa.data(), Fp8Kind::kE4M3, descale.data()}, ob{qb.data(), Fp8Kind::kE5M2, descale.data() + 1};
  fp8_gemm_tn(ctx(), m, n, k, oa, ob, y.data());
  const FVec acc0 = random_floats(rng, n * m);
  auto acc = to_device(ctx(), acc0);
  fp8_gemm_tn_accumulate(ctx(), m, n, k, oa, ob, acc.data());

  // The CPU: dequantised operands, y[j, i] = sum_k a[i, k] b[j, k] as a linear layer (x = b, W = a).
  FVec da(a.size()), db(b.size());
  float amax_a = 0, amax_b = 0;
  for (float v : a) amax_a = std::max(amax_a, std::fabs(v));
  for (float v : b) amax_b = std::max(amax_b, std::fabs(v));
  cpu::fp8_dequantised(m * k, a.data(), fp8_scale(amax_a, Fp8Kind::kE4M3), Fp8Kind::kE4M3, da.data());
  cpu::fp8_dequantised(n * k, b.data(), fp8_scale(amax_b, Fp8Kind::kE5M2), Fp8Kind::kE5M2, db.data());
  FVec ref(n * m);
  cpu::linear_forward({n, k, m}, db.data(), da.data(), nullptr, ref.data());
  EXPECT_LT(rel_error(to_host_float(ctx(), y), ref), kBf16Tolerance);
  FVec ref_acc = acc0;
  for (std::size_t i = 0; i < ref.size(); ++i) ref_acc[i] += ref[i];
  EXPECT_LT(rel_error(to_host(ctx(), acc), ref_acc), kFp32Tolerance);
}

TEST_F(Fp8Test, DimensionsCuBlasLtCannotTakeAreRefusedNamingThem) {
  auto q = allocate<std::uint8_t>(ctx(), 64 * 64);
  auto descale = allocate<float>(ctx(), 1);
  auto y = allocate<bf16>(ctx(), 64 * 64);
  const Fp8Operand o{q.data(), Fp8Kind::kE4M3, descale.data()};
  try {
    fp8_gemm_tn(ctx(), 24, 8, 64, o, o, y.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m = 24, n = 8, k = 64"), std::string::npos) << e.what();
  }
  const Fp8Operand e5{q.data(), Fp8Kind::kE5M2, descale.data()};
  EXPECT_THROW(fp8_gemm_tn(ctx(), 16, 16, 16, e5, e5, y.data()), Error);
}

}  // namespace
}  // namespace dtrain::kernels::cuda::testing
