// Grouped GEMMs for a mixture of experts on the GPU: the linear layers of several experts, each on its own rows, in
// one cuBLAS call (cublasGemmGroupedBatchedEx) instead of one launch per expert. Group g multiplies rows[g]
// consecutive rows (after those of groups 0..g-1) by its own weight, with the layouts and numerics of
// dtrain/kernels/cuda/linear.h (bf16 in, fp32 accumulation; the weight gradient accumulates into fp32). `weights` and
// `dweights` are host arrays of device pointers; groups with no rows are skipped. Where cuBLAS has no grouped kernel
// for a shape or type, the groups run one linear call each (the same results up to summation order).
#pragma once

#include <cstdint>

#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda {

// y_g [rows_g, out] = x_g [rows_g, in] W_g^T, W_g [out, in].
void grouped_linear_forward(Context& ctx, std::int64_t groups, const std::int64_t* rows, std::int64_t in,
                            std::int64_t out, const bf16* x, const bf16* const* weights, bf16* y);
// dx_g [rows_g, in] = dy_g [rows_g, out] W_g.
void grouped_linear_backward_input(Context& ctx, std::int64_t groups, const std::int64_t* rows, std::int64_t in,
                                   std::int64_t out, const bf16* dy, const bf16* const* weights, bf16* dx);
// dW_g [out, in] += dy_g^T x_g (fp32).
void grouped_linear_backward_weight(Context& ctx, std::int64_t groups, const std::int64_t* rows, std::int64_t in,
                                    std::int64_t out, const bf16* dy, const bf16* x, float* const* dweights);

// How many grouped calls on this context ran group by group because cuBLAS had no grouped kernel (tests and
// benchmarks report it).
std::int64_t grouped_linear_fallbacks(Context& ctx);

}  // namespace dtrain::kernels::cuda
