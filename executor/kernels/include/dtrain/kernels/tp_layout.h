// How the fused weights are laid out in full and how a column-parallel split hands each rank its part.
//
// Full (unsharded) layouts, the ones checkpoints store (rows = output features, PyTorch's [out, in]):
//   attn.qkv weight  [(heads + 2 kv_heads) * d, hidden], rows [ Q (heads * d) | K (kv_heads * d) | V (kv_heads * d) ]
//                    (the concatenation of Hugging Face's q_proj, k_proj, v_proj); bias likewise.
//   mlp.fc1 weight   GELU:   [ffn_hidden, hidden]
//                    SwiGLU: [2 * ffn_hidden, hidden], rows [ gate (ffn_hidden) | up (ffn_hidden) ] (Hugging Face's
//                    gate_proj then up_proj).
// Rank r of a tensor-parallel group of size tp holds, in this order (activation.h, attention.h read its output so):
//   attn.qkv: query heads [r h/tp, (r+1) h/tp), then kv heads [r kv/tp, (r+1) kv/tp) of K, then the same of V,
//             so its output row is [Q_r | K_r | V_r] and attention runs on n_heads = h/tp, n_kv_heads = kv/tp.
//   mlp.fc1:  SwiGLU: gate rows [r f, (r+1) f), then up rows [r f, (r+1) f), f = ffn_hidden / tp, so its output
//             row is [gate_r | up_r] and gate column j pairs with up column j; GELU: rows [r f, (r+1) f).
// Each part is a contiguous slice of the full tensor, so a checkpoint taken with one tp re-splits for another by
// slicing. Row-parallel weights (attn.proj, mlp.fc2: [hidden, in]) are split by columns [r in/tp, (r+1) in/tp).
#pragma once

#include <cstdint>

namespace dtrain::kernels {

struct TpRank {
  std::int64_t rank = 0;
  std::int64_t size = 1;
};

// Full-tensor row of local row `local_row` of rank tp's QKV weight. Throws dtrain::Error (input) when tp.size does
// not divide heads and kv_heads, or local_row is out of range.
std::int64_t qkv_full_row(std::int64_t local_row, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                          TpRank tp);

// Full-tensor row of local row `local_row` of rank tp's fc1 weight (swiglu: fused gate and up). Throws
// dtrain::Error (input) when tp.size does not divide ffn_hidden, or local_row is out of range.
std::int64_t fc1_full_row(std::int64_t local_row, std::int64_t ffn_hidden, bool swiglu, TpRank tp);

}  // namespace dtrain::kernels
