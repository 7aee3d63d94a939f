// AdamW, gradient norm and scaling on the GPU, over fp32 master weights, gradients and moments: the exact update and
// operation order of dtrain/kernels/optimizer.h (each multiply and add rounded separately, no fused multiply-adds, so
// the GPU computes the same float operations as the formula lists).
//
// Multi-tensor: one call updates a list of buffers (AdamWBuffer / GradBuffer hold device pointers; the lists themselves
// are host arrays). The buffer descriptors travel as kernel parameters, up to 32 buffers per launch, so a call costs
// ceil(count / 32) launches and no host-to-device copy.
#pragma once

#include <cstdint>

#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/optimizer.h"

namespace dtrain::kernels::cuda {

// Updates every buffer in place. Throws dtrain::Error (internal) when step < 1.
void adamw_step(Context& ctx, const AdamWConfig& config, const AdamWBuffer* buffers, std::int64_t count);

// *result (a device double, overwritten) = sum over buffers of sum_i grad[i]^2. Deterministic: every buffer is cut into
// blocks of 4096 elements (as on the CPU); each block's squares are summed in float64 in a fixed tree order, and a
// second kernel adds the block sums in a fixed order. Not bitwise equal to the CPU's sum (a different tree), equal to
// float64 rounding. Scratch: one double per block, from the pool.
void grad_norm_squared(Context& ctx, const GradBuffer* buffers, std::int64_t count, double* result);

// x[i] *= factor.
void scale(Context& ctx, std::int64_t n, float factor, float* x);

}  // namespace dtrain::kernels::cuda
