// Mixture-of-experts kernels on the GPU: dtrain/kernels/moe.h's operations and layouts, bf16 activations, fp32
// probabilities, gates and gradients, computed in fp32. The router and its gradient run one thread per token (the
// sums in the CPU kernels' order); the permutations one thread per element; the gate gradients one block per
// assignment (a fixed-order block reduction).
#pragma once

#include <cstdint>

#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/moe.h"

namespace dtrain::kernels::cuda {

void moe_route(Context& ctx, const MoeRouteShape& shape, const bf16* logits, float* probs, std::int32_t* expert,
               float* gate);
void moe_route_backward(Context& ctx, const MoeRouteShape& shape, const float* probs, const std::int32_t* expert,
                        const float* dgate, const float* aux_grad, std::int64_t seq_len, bf16* dlogits);
void moe_gather_rows(Context& ctx, std::int64_t n, std::int64_t cols, const bf16* src, const std::int32_t* rows,
                     bf16* dst);
void moe_unpermute(Context& ctx, std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const bf16* src,
                   const std::int32_t* slot, const float* weight, bool accumulate, bf16* out);
void moe_unpermute_backward(Context& ctx, std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const bf16* dout,
                            const bf16* src, const std::int32_t* slot, const float* gate, bf16* dsrc, float* dgate);

void moe_sigmoid_gate(Context& ctx, std::int64_t tokens, const bf16* z, float* g);
void moe_sigmoid_gate_backward(Context& ctx, std::int64_t tokens, const float* g, const float* dg, bf16* dz);

}  // namespace dtrain::kernels::cuda
