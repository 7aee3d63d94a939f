// Fused causal attention with grouped-query heads on the GPU: dtrain/kernels/attention.h's formulas, layouts and
// strides (counted in bf16 elements), FlashAttention-2's algorithm (Dao 2023), never materialising the s x s matrix.
//
// Types: q, k, v, o, dout, dq, dk, dv bf16; lse fp32 [batch, n_heads, seq]. Scores, probabilities, the running
// softmax statistics and every accumulator are fp32; only the outputs are rounded to bf16.
//
// Forward: one thread block per (64-query block, query head, sequence). It walks the 64-key tiles up to the diagonal
// with an online softmax (running max and sum, the partial output rescaled when the max grows) and writes
// o = acc / l and lse = max + log(l). Blocks with the most tiles (the last query blocks) are scheduled first.
// Backward recomputes each tile's probabilities from lse (P = exp(S - lse)) with D = rowsum(dO o O), in two kernels
// so that every output has exactly one writer (deterministic, no atomics):
//   dQ kernel,  one block per (query block, query head, sequence):  dQ = scale * sum over key tiles of dS K
//   dKV kernel, one block per (key block, kv head, sequence), summing over the kv head's query heads in order:
//               dV = sum P^T dO,  dK = scale * sum dS^T Q
// with dS = P o (dP - D) and dP = dO V^T (dropout: P and dP masked and scaled as on the CPU). The split recomputes
// S and dP once more than FlashAttention-2's single pass with atomic dQ updates (7 tile products instead of 5).
//
// This first version multiplies tiles with fp32 FMAs from shared memory (tiles held as fp32, a 4x4 register tile per
// thread); it is written to be obviously right, not fast: tensor cores (mma.sync / wgmma) are the next step.
// Supported head_dim: 16, 32, 64, 128 (compile-time tile widths). Dynamic shared memory up to 162 KiB per block
// (dKV kernel, head_dim 128), within Hopper's 227 KiB (an A100 has 163 KiB: head_dim 128 backward just fits).
// Scratch: D, batch * n_heads * seq floats, from the pool. D is computed from the stored bf16 O (what FlashAttention
// does), the CPU backend's from its fp32 O: one more source of the bf16-sized difference between the two.
//
// Dropout on the probabilities (AttentionDropout, p > 0) draws the CPU backend's masks bit for bit (the Philox
// contract of dropout.h), computed inside the kernels.
#pragma once

#include <cstdint>

#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda {

// True for the head dimensions the kernels are compiled for.
bool attention_supports_head_dim(std::int64_t head_dim);

// Throws dtrain::Error: internal for inconsistent shapes (as the CPU backend), input for an unsupported head_dim.
// dropout may be nullptr.
void attention_forward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                       float* lse, const AttentionDropout* dropout);

// dq, dk, dv are overwritten (they may point into one fused buffer with q's and kv's strides; they must not alias
// q, k, v, o or dout).
void attention_backward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* o, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                        const AttentionDropout* dropout);

}  // namespace dtrain::kernels::cuda
