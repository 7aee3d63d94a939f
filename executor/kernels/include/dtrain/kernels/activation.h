// MLP activations: GELU (tanh approximation) and SwiGLU.
//
// GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. for "GELU(x) ~ 0.5x(1 + tanh(...))"; what GPT-2, Megatron
// and PyTorch's gelu(approximate='tanh') compute):
//   u(x) = sqrt(2/pi) * (x + 0.044715 x^3),  gelu(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u)
//   gelu'(x) = sigmoid(2u) + x * sigmoid(2u) * (1 - sigmoid(2u)) * 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// The sigmoid form is used because it keeps full relative accuracy where 1 + tanh(u) cancels (large negative x).
//
// SwiGLU (Shazeer 2020, Llama): y = silu(gate) * up, silu(g) = g * sigmoid(g). The first MLP matrix (mlp.fc1) is
// fused: its output on each rank is laid out [tokens, 2 * f] with the row of token t being
//   [ gate_0 .. gate_{f-1} | up_0 .. up_{f-1} ]
// where f is this rank's share of ffn_hidden (ffn_hidden / tp). Gate column j pairs with up column j of the same
// rank. For a column-parallel split to give each rank matching halves, rank r's fc1 weight rows are the gate rows
// [r f, (r+1) f) followed by the up rows [r f, (r+1) f) of the full weight (whose rows are [gate (ffn_hidden) |
// up (ffn_hidden)]); tp_layout.h maps local rows to full rows. Backward:
//   dgate = dy * up * silu'(gate),  silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))),  dup = dy * silu(gate)
//
// Layouts (row-major, contiguous). Activation gradients are overwritten.
#pragma once

#include <cstdint>

namespace dtrain::kernels::cpu {

// y[i] = gelu(x[i]) for n elements.
void gelu_forward(std::int64_t n, const float* x, float* y);
// dx[i] = dy[i] * gelu'(x[i]). dx may alias dy.
void gelu_backward(std::int64_t n, const float* x, const float* dy, float* dx);

// gate_up [tokens, 2 * ffn] -> y [tokens, ffn].
void swiglu_forward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, float* y);
// dgate_up [tokens, 2 * ffn] from dy [tokens, ffn].
void swiglu_backward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, const float* dy, float* dgate_up);

}  // namespace dtrain::kernels::cpu
