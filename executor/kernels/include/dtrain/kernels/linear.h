// Linear layer on one rank's shard: y = x W^T + b, the matmul of every projection (attn.qkv, attn.proj, mlp.fc1,
// mlp.fc2, head.logits).
//
// Layouts (row-major, contiguous):
//   x  [tokens, in_features]            activations, token t = b * seq + s
//   W  [out_features, in_features]      PyTorch's nn.Linear layout; a column-parallel split (Megatron's
//                                       ColumnParallelLinear) gives each rank a block of rows of W, a row-parallel
//                                       split a block of columns (then each rank's y is a partial sum to all-reduce,
//                                       and the bias is added by one rank only or after the reduction)
//   b  [out_features]                   optional (nullptr: no bias)
//   y  [tokens, out_features]
//
// Conventions shared by every kernel in dtrain::kernels: activation gradients are overwritten, parameter gradients
// are accumulated (+=) so that micro-batches add up in one buffer; sizes are element counts (std::int64_t);
// pointers must not alias unless a function says they may.
#pragma once

#include <cstdint>

namespace dtrain::kernels {

struct LinearShape {
  std::int64_t tokens = 0;
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
};

namespace cpu {

// y[t, o] = sum_i x[t, i] * W[o, i] + b[o]. One cblas_sgemm (NoTrans x Trans).
void linear_forward(const LinearShape& shape, const float* x, const float* weight, const float* bias, float* y);

// Input gradient: dx[t, i] = sum_o dy[t, o] * W[o, i] (overwrites dx). For a column-parallel layer dx is a partial
// sum the caller all-reduces over the tensor-parallel group.
void linear_backward_input(const LinearShape& shape, const float* dy, const float* weight, float* dx);

// Weight gradients: dW[o, i] += sum_t dy[t, o] * x[t, i]; db[o] += sum_t dy[t, o] (db may be nullptr).
// Separate from the input gradient so that a schedule can run it later (zero-bubble pipelines split backward in two).
void linear_backward_weight(const LinearShape& shape, const float* dy, const float* x, float* dweight, float* dbias);

// Both gradients.
void linear_backward(const LinearShape& shape, const float* dy, const float* x, const float* weight, float* dx,
                     float* dweight, float* dbias);

}  // namespace cpu
}  // namespace dtrain::kernels
