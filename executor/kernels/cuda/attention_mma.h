// Internal: the tensor-core path of the CUDA fused causal attention (attention_mma.cu), which attention.cu's
// attention_forward and attention_backward call where it applies (see dtrain/kernels/cuda/attention.h for the
// choice and DTRAIN_ATTENTION_KERNEL).
//
// The functions compute exactly what attention_forward and attention_backward promise (dtrain/kernels/attention.h:
// causal, grouped-query heads, q and kv strides, lse [batch, n_heads, seq] in natural-log units, outputs overwritten)
// with bf16 tensor-core products (mma.sync m16n8k16, fp32 accumulators) instead of fp32 FMAs; results are bitwise
// repeatable (each output element has one writer, every sum runs in a fixed order, no atomics).
#pragma once

#include <cstdint>

#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda::detail {

// True when the tensor-core kernels can compute this shape: head_dim 64 or 128, no dropout (nullptr or p == 0),
// q_stride and kv_stride multiples of 8 elements (16-byte rows for the asynchronous copies) and seq below the grid
// limit (65535 blocks of 64 rows). The tensors must also start at 16-byte aligned addresses
// (attention_mma_aligned).
bool attention_mma_supports(const AttentionShape& shape, const AttentionDropout* dropout);

// True when p is 16-byte aligned (every tensor the tensor-core kernels read or write must be).
bool attention_mma_aligned(const void* p);

// attention_forward for a shape attention_mma_supports accepts and that make_geometry's checks passed, with at least
// one sequence, token and head. Throws dtrain::Error (internal) when a CUDA call fails.
void attention_mma_forward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                           bf16* o, float* lse);

// attention_backward under the same conditions; lse is the forward's. Scratch: D = rowsum(dO o O), batch * n_heads *
// seq floats, from the pool.
void attention_mma_backward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                            const bf16* o, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv);

}  // namespace dtrain::kernels::cuda::detail
