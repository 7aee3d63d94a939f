// Linear layers on the GPU: the three GEMMs of dtrain/kernels/linear.h through cuBLASLt, bf16 inputs with fp32
// accumulation (CUBLAS_COMPUTE_32F).
//
// Layouts and formulas are linear.h's (row-major x [tokens, in], W [out, in], y [tokens, out]). Row-major buffers are
// handed to cuBLASLt (column-major) as their transposes, so no copy is made:
//   forward          y^T  = W   x^T    ("TN": m = out, n = tokens, k = in)
//   backward input   dx^T = W^T dy^T   ("NN": m = in,  n = tokens, k = out)
//   backward weight  dW^T += x^T dy    ("NT": m = in,  n = out,    k = tokens; beta = 1 into the fp32 dW)
// The bias is added by cuBLASLt's BIAS epilogue in fp32 before the output is rounded (no extra pass). Should the
// library offer no algorithm with the epilogue for a shape, the GEMM runs without it and bias_add (elementwise.h)
// adds the bias to the rounded output (one extra pass, and the sum is rounded twice).
// The bias gradient is a separate deterministic column sum (bias_grad), accumulated into the fp32 db (cuBLASLt's
// BGRADB epilogue writes rather than accumulates, in the output type).
//
// Each (operation, shape, pointer alignment) gets one cuBLASLt algorithm, picked by its heuristic on first use and
// cached in the Context, so repeated calls run the same algorithm (bitwise repeatable; see context.h). Pointers need
// only element alignment: the alignment of each pointer is passed to the heuristic, which then avoids algorithms that
// need more. Dimensions of 0 are allowed (nothing to multiply: the outputs get what the formulas say).
#pragma once

#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/linear.h"

namespace dtrain::kernels::cuda {

// y[t, o] = sum_i x[t, i] W[o, i] + b[o]; bf16 out (bias bf16, may be nullptr).
void linear_forward(Context& ctx, const LinearShape& shape, const bf16* x, const bf16* weight, const bf16* bias,
                    bf16* y);
// The same GEMM with an fp32 output (bias fp32, may be nullptr): for logits that feed an fp32 cross entropy.
void linear_forward(Context& ctx, const LinearShape& shape, const bf16* x, const bf16* weight, const float* bias,
                    float* y);

// dx[t, i] = sum_o dy[t, o] W[o, i] (overwrites dx; bf16).
void linear_backward_input(Context& ctx, const LinearShape& shape, const bf16* dy, const bf16* weight, bf16* dx);

// dW[o, i] += sum_t dy[t, o] x[t, i] into the fp32 dW; db[o] += sum_t dy[t, o] into the fp32 db (nullptr: none).
void linear_backward_weight(Context& ctx, const LinearShape& shape, const bf16* dy, const bf16* x, float* dweight,
                            float* dbias);

// Both gradients.
void linear_backward(Context& ctx, const LinearShape& shape, const bf16* dy, const bf16* x, const bf16* weight,
                     bf16* dx, float* dweight, float* dbias);

}  // namespace dtrain::kernels::cuda
