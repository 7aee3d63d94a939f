// MLP activations on the GPU: GELU (tanh) and SwiGLU with dtrain/kernels/activation.h's formulas and layouts, bf16 in
// and out, computed in fp32 (sigmoid through expf).
#pragma once

#include <cstdint>

#include "dtrain/kernels/activation.h"
#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda {

// y[i] = gelu(x[i]) for n elements.
void gelu_forward(Context& ctx, std::int64_t n, const bf16* x, bf16* y);
// dx[i] = dy[i] * gelu'(x[i]). dx may alias dy.
void gelu_backward(Context& ctx, std::int64_t n, const bf16* x, const bf16* dy, bf16* dx);

// gate_up [tokens, 2 * ffn] ([gate | up] per row) -> y [tokens, ffn].
void swiglu_forward(Context& ctx, std::int64_t tokens, std::int64_t ffn, const bf16* gate_up, bf16* y);
// dgate_up [tokens, 2 * ffn] from dy [tokens, ffn] (overwritten).
void swiglu_backward(Context& ctx, std::int64_t tokens, std::int64_t ffn, const bf16* gate_up, const bf16* dy,
                     bf16* dgate_up);

}  // namespace dtrain::kernels::cuda
