// Causal self-attention on this rank's heads, with grouped-query attention (GQA, Ainslie et al. 2023).
//
// For every sequence b and local query head h, with kv head g = h / (n_heads / n_kv_heads) and scale 1/sqrt(d):
//   S[i, j] = scale * q[b, i, h, :] . k[b, j, g, :]          for j <= i (causal), -inf for j > i
//   P[i, :] = softmax(S[i, :])                                (fp32; row-wise log-sum-exp saved: lse[i])
//   o[b, i, h, :] = sum_j dropout(P)[i, j] v[b, j, g, :]
//
// Implementation (FlashAttention, Dao et al. 2022, Algorithms 1 and 2, adapted to a CPU): queries are processed in
// blocks of kQueryBlock rows and keys in chunks of kKeyChunk, with an online softmax (running max and sum, the
// partial output rescaled when the max grows), so the s x s score matrix is never stored — only one
// kQueryBlock x kKeyChunk tile per thread. Chunks entirely above the diagonal are skipped (half the work of a causal
// product). Forward keeps lse = max + log(sum exp) per query row; backward recomputes each tile's probabilities from
// it (P = exp(S - lse)) and uses D[i] = dO[i] . O[i] (FlashAttention's "D = rowsum(dO o O)") for the softmax gradient:
//   dV += dropout(P)^T dO,  dP = dO V^T (* dropout mask),  dS = P o (dP - D),  dQ = scale dS K,  dK += scale dS^T Q
// Work is split over (sequence, kv head) pairs; each pair owns its dK and dV rows and the dQ of its query heads,
// and sums in a fixed order, so results are bitwise repeatable and independent of the thread count. A GPU fused
// kernel (issue 8) follows the same algorithm with its own tile sizes.
//
// Memory: no s x s matrix. Each pair copies its operands into dense panels (K^T, V, one head's Q; backward also V^T,
// K, dO and the three gradients), about 3 seq * d floats forward and 8 seq * d backward, plus tiles; this scratch
// memory belongs to the calling thread and is kept for the next call (it grows to the largest shape seen).
//
// Tensor parallelism: heads are split over the group (Megatron), so this rank holds n_heads = heads / tp query heads
// and n_kv_heads = kv_heads / tp kv heads, taken from the column-parallel QKV projection.
//
// Context parallelism: a rank holds chunks of each sequence, and each chunk's queries attend to all keys up to their
// own position. With q_rows set, every sequence has q_rows queries at positions q_offset .. q_offset + q_rows - 1
// against `seq` keys at positions 0 .. seq - 1 (causal: query position p sees keys 0..p; a query at or past position
// seq - 1 sees them all, as a block of keys wholly before a block of queries in the ring exchange: cp_ring.cc);
// q, o, dq and lse then hold q_rows rows per sequence, k, v, dk and dv seq rows. (CPU kernels only.)
//
// Layouts (row-major; token t = b * seq + i):
//   q   : query head h of token t at q[t * q_stride + h * d]        (q_stride >= n_heads * d)
//   k, v: kv head g of token t at k[t * kv_stride + g * d]          (kv_stride >= n_kv_heads * d)
//         so q, k and v can point into one fused QKV activation [tokens, (n_heads + 2 n_kv_heads) d] with
//         q_stride = kv_stride = its row length, k = q + n_heads d, v = k + n_kv_heads d.
//   o   : [tokens, n_heads * d] contiguous (the input of the row-parallel output projection)
//   lse : [batch, n_heads, seq] (q_rows in place of seq when set)
//   dq, dk, dv: the layouts (and strides) of q, k, v: they can point into one fused d(QKV) buffer. Overwritten.
#pragma once

#include <cstdint>

#include "dtrain/kernels/dropout.h"

namespace dtrain::kernels {

struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::int64_t n_heads = 0;     // local query heads
  std::int64_t n_kv_heads = 0;  // local kv heads; divides n_heads
  std::int64_t head_dim = 0;
  std::int64_t q_stride = 0;   // floats between consecutive tokens in q (and dq)
  std::int64_t kv_stride = 0;  // floats between consecutive tokens in k, v (and dk, dv)
  std::int64_t q_rows = 0;     // queries per sequence: 0 for seq (self-attention over the whole sequence)
  std::int64_t q_offset = 0;   // the position of the first query (context parallelism)

  std::int64_t query_rows() const { return q_rows > 0 ? q_rows : seq; }
};

// Dropout on the attention probabilities (p == 0: none). Element (sample, head, i, j) of the probabilities has global
// index ((sample_begin + b) * total_heads + head_begin + h) * seq * seq + i * seq + j, so tensor-parallel head
// slices draw the masks of the unsharded run (dropout.h).
struct AttentionDropout {
  float p = 0.0f;
  DropoutKey key;  // site kAttentionProbs
  std::int64_t sample_begin = 0;
  std::int64_t head_begin = 0;   // global index of this rank's first query head
  std::int64_t total_heads = 0;  // query heads of the whole model
};

namespace cpu {

// Query rows per tile and keys per chunk of the tiled algorithm.
inline constexpr std::int64_t kQueryBlock = 64;
inline constexpr std::int64_t kKeyChunk = 128;

// Throws dtrain::Error (internal) for inconsistent shapes (n_kv_heads not dividing n_heads, strides too small).
// dropout may be nullptr.
void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v, float* o,
                       float* lse, const AttentionDropout* dropout);

void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        const AttentionDropout* dropout);

}  // namespace cpu
}  // namespace dtrain::kernels
