// LayerNorm and RMSNorm on the GPU: the formulas and layouts of dtrain/kernels/norm.h.
//
// Types: x, y, dy, dx bf16 [rows, hidden]; gamma, beta fp32 [hidden] (the master weights themselves: they are a few
// KB, so no bf16 copy is kept); mean, rstd fp32 [rows]; dgamma, dbeta fp32 [hidden], accumulated (+=).
// Statistics are computed in fp32 with a two-pass variance (mean first, then the squared deviations), as the CPU
// kernels do, so a large mean does not cost digits.
//
// Kernels: forward and the dx part of backward use one thread block per row (block reductions in a fixed order). The
// parameter gradients are column sums over the rows, done deterministically in two passes: partial sums over fixed
// chunks of 64 rows, then the chunks added in order and accumulated into dgamma/dbeta. Scratch memory for the partial
// sums (2 * ceil(rows / 64) * hidden floats) comes from the context's pool.
#pragma once

#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/norm.h"

namespace dtrain::kernels::cuda {

// beta may be nullptr (no bias).
void layernorm_forward(Context& ctx, const NormShape& shape, const bf16* x, const float* gamma, const float* beta,
                       float eps, bf16* y, float* mean, float* rstd);
// dbeta may be nullptr (no bias).
void layernorm_backward(Context& ctx, const NormShape& shape, const bf16* x, const float* gamma, const float* mean,
                        const float* rstd, const bf16* dy, bf16* dx, float* dgamma, float* dbeta);

void rmsnorm_forward(Context& ctx, const NormShape& shape, const bf16* x, const float* gamma, float eps, bf16* y,
                     float* rstd);
void rmsnorm_backward(Context& ctx, const NormShape& shape, const bf16* x, const float* gamma, const float* rstd,
                      const bf16* dy, bf16* dx, float* dgamma);

}  // namespace dtrain::kernels::cuda
