// FP8 on the GPU: amaxes, casts to E4M3/E5M2 under the power-of-two scales of dtrain/kernels/fp8.h (computed on the
// device from an amax in device memory, so no step waits for the host), and cuBLASLt's FP8 GEMMs.
//
// Casts round to nearest, ties to even, saturating at the format's largest value (__nv_cvt_float_to_fp8 with
// __NV_SATFINITE): round_to_fp8's values. FP8 elements are stored as bytes (std::uint8_t): the bits of __nv_fp8_e4m3
// and __nv_fp8_e5m2.
//
// cuBLASLt multiplies FP8 operands only as "TN" (both operands with K contiguous), E4M3 x E4M3 or E4M3 x E5M2 (not
// E5M2 x E5M2), with every leading dimension a multiple of 16 bytes: fp8_gemm_tn checks the dimensions (k and m
// multiples of 16) and throws dtrain::Error (input) naming them otherwise. Accumulation is fp32 (no fast
// accumulation), the descales of both operands applied in the epilogue.
#pragma once

#include <cstdint>

#include "dtrain/common/bf16.h"
#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/fp8.h"

namespace dtrain::kernels::cuda {

// *amax = max_i |x[i]| over n elements (one device float, overwritten; NaN where an element is NaN).
void fp8_amax(Context& ctx, std::int64_t n, const bf16* x, float* amax);
// *seen = max(*seen, *amax): one tensor's amax kept for the next step's scale (delayed scaling). Device floats.
void fp8_record_amax(Context& ctx, const float* amax, float* seen);
// previous[i] = seen[i], seen[i] = 0 for i < n: the delayed recipe's history, rolled at a step's start.
void fp8_roll_history(Context& ctx, std::int64_t n, float* seen, float* previous);

// x [rows, cols] (row-major bf16) cast to FP8 under s = fp8_scale(*amax, kind), with *amax read on the device: into
// q [rows, cols] and/or qt, its transpose [cols, qt_ld] with qt_ld >= rows (the padding zeroed: a GEMM over K = rows
// padded to a multiple of 16 adds nothing for it); either may be nullptr. *descale = 1 / s.
void fp8_cast(Context& ctx, std::int64_t rows, std::int64_t cols, const bf16* x, const float* amax, Fp8Kind kind,
              std::uint8_t* q, std::uint8_t* qt, std::int64_t qt_ld, float* descale);

// One FP8 operand: `data` holds the matrix with K contiguous (row-major [rows, k]), of format `kind`; `descale` (a
// device float) is 1 / its scale.
struct Fp8Operand {
  const std::uint8_t* data = nullptr;
  Fp8Kind kind = Fp8Kind::kE4M3;
  const float* descale = nullptr;
};

// D[j, i] = descale_a descale_b sum_k A[i, k] B[j, k] for A [m, k] and B [n, k] (both row-major, K contiguous), D
// row-major [n, m]: bf16 (overwritten), or fp32 with beta = 1 (accumulated: a weight gradient).
void fp8_gemm_tn(Context& ctx, std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a, const Fp8Operand& b,
                 bf16* d);
void fp8_gemm_tn_accumulate(Context& ctx, std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                            const Fp8Operand& b, float* d);

}  // namespace dtrain::kernels::cuda
