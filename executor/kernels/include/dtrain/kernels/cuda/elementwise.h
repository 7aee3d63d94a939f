// Tensor utilities of the CUDA backend: dtype casts, fills, bias add and the bias gradient.
#pragma once

#include <cstdint>

#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda {

// y[i] = nearest bf16 to x[i] (ties to even): the bf16 weight copies from the fp32 master weights.
void cast_fp32_to_bf16(Context& ctx, std::int64_t n, const float* x, bf16* y);
// y[i] = x[i] (exact).
void cast_bf16_to_fp32(Context& ctx, std::int64_t n, const bf16* x, float* y);

// x[i] = value (for bf16, value rounded to bf16).
void fill(Context& ctx, std::int64_t n, float value, float* x);
void fill(Context& ctx, std::int64_t n, float value, bf16* x);

// y[r, c] += bias[c] for y [rows, cols] row-major (in fp32, rounded once for bf16).
void bias_add(Context& ctx, std::int64_t rows, std::int64_t cols, const bf16* bias, bf16* y);
void bias_add(Context& ctx, std::int64_t rows, std::int64_t cols, const float* bias, float* y);

// dbias[c] += sum_r dy[r, c] (fp32), deterministic: partial sums over fixed chunks of 64 rows, then the chunks in
// order. Scratch: ceil(rows / 64) * cols floats from the pool.
void bias_grad(Context& ctx, std::int64_t rows, std::int64_t cols, const bf16* dy, float* dbias);

}  // namespace dtrain::kernels::cuda
