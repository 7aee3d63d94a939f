// Fused causal attention with grouped-query heads on the GPU: dtrain/kernels/attention.h's formulas, layouts and
// strides (counted in bf16 elements), FlashAttention-2's algorithm (Dao 2023), never materialising the s x s matrix.
//
// Types: q, k, v, o, dout, dq, dk, dv bf16; lse fp32 [batch, n_heads, seq]. Scores, probabilities, the running
// softmax statistics and every accumulator are fp32; only the outputs are rounded to bf16.
//
// Forward: one thread block per (query block, query head, sequence). It walks the key tiles up to the diagonal
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
// Two implementations of those kernels, with the same outputs up to fp32 summation order and bf16 rounding:
//   tensor cores ("mma", cuda/attention_mma.cu): bf16 tiles multiplied with mma.sync.m16n8k16 (fp32 accumulators),
//     8 warps per block, each owning 16 rows of every product so that probabilities go from the score accumulators
//     to the next product in registers; forward and dQ blocks of 128 query rows with 64-key tiles, dK/dV blocks of
//     128 keys with 32-row (head_dim 128) or 64-row query tiles, tiles double-buffered with cp.async. For head_dim 64
//     and 128 without dropout, strides multiples of 8 and 16-byte aligned tensors; up to 136 KiB of shared memory
//     per block (dQ kernel, head_dim 128; sm_80 and later).
//   fp32 ("simt", cuda/attention.cu): tiles held as fp32 in shared memory and multiplied with FMAs (a 4x4 register
//     tile per thread), 64 x 64 tiles; every supported head_dim (16, 32, 64, 128) and dropout. Up to 162 KiB of
//     shared memory per block (dKV kernel, head_dim 128), within Hopper's 227 KiB (an A100 has 163 KiB).
// AttentionKernel::kAuto (the default) takes the tensor cores wherever they apply and the fp32 kernels elsewhere;
// DTRAIN_ATTENTION_KERNEL=simt makes kAuto take the fp32 kernels everywhere (to compare, or to rule the tensor-core
// path out), and kSimt / kMma pick one path whatever the environment (tests, benchmarks).
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

// Which implementation computes attention (see above).
enum class AttentionKernel {
  kAuto,  // tensor cores where they apply, fp32 elsewhere; DTRAIN_ATTENTION_KERNEL=simt: fp32 everywhere
  kSimt,  // the fp32 kernels
  kMma,   // the tensor-core kernels; a call they do not apply to throws dtrain::Error (input)
};

// The choice DTRAIN_ATTENTION_KERNEL makes for kAuto, read now: kAuto when the variable is unset, empty or "mma",
// kSimt for "simt". Throws dtrain::Error (input) naming the variable and the allowed values for anything else.
// attention_forward and attention_backward read the variable once, at their first kAuto call.
AttentionKernel attention_kernel_from_environment();

// True for the head dimensions the kernels are compiled for.
bool attention_supports_head_dim(std::int64_t head_dim);

// Throws dtrain::Error: internal for inconsistent shapes (as the CPU backend), input for an unsupported head_dim, for
// kMma where the tensor-core kernels do not apply, and for a bad DTRAIN_ATTENTION_KERNEL. dropout may be nullptr.
void attention_forward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                       float* lse, const AttentionDropout* dropout, AttentionKernel kernel = AttentionKernel::kAuto);

// dq, dk, dv are overwritten (they may point into one fused buffer with q's and kv's strides; they must not alias
// q, k, v, o or dout). lse may come from either implementation's forward (both store natural-log units).
void attention_backward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* o, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                        const AttentionDropout* dropout, AttentionKernel kernel = AttentionKernel::kAuto);

}  // namespace dtrain::kernels::cuda
