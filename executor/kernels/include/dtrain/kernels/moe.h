// Mixture-of-experts kernels: the router (softmax over the experts, top-k), the permutation of tokens to the experts
// and back, and their gradients. The expert MLPs themselves are linear layers over row ranges of the permuted tokens
// (linear.h), one per expert.
//
// Layouts. logits, probs and dlogits are [tokens, experts]; expert, gate, slot and dgate [tokens, top_k] (a token's
// choices in descending probability). The permuted tokens are rows [0, n) grouped by expert, each expert's rows in
// token order: row i holds token rows[i]; slot[t, j] is the row of token t's j-th choice, or -1 when the assignment
// was dropped (over the expert's capacity).
//
// Numerics. Probabilities, gates and their gradients are fp32; every sum runs in index order in fp32 (the CUDA
// kernels keep the same order per output). Top-k ties go to the lower expert index.
#pragma once

#include <cstdint>

namespace dtrain::kernels {

struct MoeRouteShape {
  std::int64_t tokens = 0;
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
  bool normalize = true;  // gates = the top-k probabilities divided by their sum
};

namespace cpu {

// probs[t, :] = softmax(logits[t, :]); expert[t, :] the top_k experts by probability; gate[t, j] = probs[t, expert[t,
// j]]
// (/ the sum of the k with normalize).
void moe_route(const MoeRouteShape& shape, const float* logits, float* probs, std::int32_t* expert, float* gate);
// dlogits [tokens, experts] (overwritten) from the gates' gradient dgate and, when aux_grad is not nullptr, the
// load-balancing loss's gradient on the probabilities: aux_grad[(t / seq_len) * experts + e] for token t.
void moe_route_backward(const MoeRouteShape& shape, const float* probs, const std::int32_t* expert, const float* dgate,
                        const float* aux_grad, std::int64_t seq_len, float* dlogits);
// dst[i, :] = src[rows[i], :] for i in [0, n).
void moe_gather_rows(std::int64_t n, std::int64_t cols, const float* src, const std::int32_t* rows, float* dst);
// out[t, :] (= 0 unless accumulate) += sum_j weight[t, j] * src[slot[t, j], :], j in order, dropped slots skipped;
// weight nullptr: 1.
void moe_unpermute(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const float* src,
                   const std::int32_t* slot, const float* weight, bool accumulate, float* out);
// The gradient of moe_unpermute with weight = gate: dsrc[slot[t, j], :] = gate[t, j] * dout[t, :] (every row of
// dsrc is some slot's) and dgate[t, j] = dot(dout[t, :], src[slot[t, j], :]) (0 when dropped).
void moe_unpermute_backward(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const float* dout,
                            const float* src, const std::int32_t* slot, const float* gate, float* dsrc, float* dgate);

// The shared experts' gate (Qwen2-MoE): g[t] = sigmoid(z[t]) in fp32; its backward dz[t] = g[t] (1 - g[t]) dg[t].
void moe_sigmoid_gate(std::int64_t tokens, const float* z, float* g);
void moe_sigmoid_gate_backward(std::int64_t tokens, const float* g, const float* dg, float* dz);

}  // namespace cpu
}  // namespace dtrain::kernels
