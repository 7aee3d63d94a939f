// Rotary position embedding on the GPU: dtrain/kernels/rope.h's half-split rotation, in place on bf16 heads.
//
// cos and sin are device copies of the fp32 tables from kernels::rope_table() ([seq, head_dim / 2]), made once per
// sequence length. RopeShape::row_stride counts bf16 elements here (floats on the CPU): the distance between token t
// and t + 1, so the kernels work inside the fused QKV activation as the CPU ones do. Each pair is rotated in fp32 and
// rounded once.
#pragma once

#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/rope.h"

namespace dtrain::kernels::cuda {

// x <- rotate(x, +angle).
void rope_forward(Context& ctx, const RopeShape& shape, const float* cos, const float* sin, bf16* x);
// dx <- rotate(dx, -angle).
void rope_backward(Context& ctx, const RopeShape& shape, const float* cos, const float* sin, bf16* dx);

}  // namespace dtrain::kernels::cuda
