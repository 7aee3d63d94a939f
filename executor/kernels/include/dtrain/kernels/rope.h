// Rotary position embedding (RoPE, Su et al. 2021) on the query and key heads, in the Llama / Hugging Face
// convention ("rotate_half", half-split pairs):
//
//   for a head vector x of even size d and i in [0, d/2), at position p:
//     angle(p, i) = p * theta^(-2i/d)
//     y[i]       = x[i]       * cos(angle) - x[i + d/2] * sin(angle)
//     y[i + d/2] = x[i + d/2] * cos(angle) + x[i]       * sin(angle)
//
// i.e. element i is paired with element i + d/2 (not with i + 1 as in the original interleaved formulation; the two
// differ by a fixed permutation of the Q and K weight rows). theta is ModelSpec::rope_theta. Backward is the inverse
// rotation (angle -> -angle) applied to the gradient.
//
// Heads are addressed with a row stride so that the kernels work in place inside the fused QKV activation
// [tokens, (n_heads + 2 * n_kv_heads) * d]: call once for the queries (pointer at column 0, n_heads local query
// heads) and once for the keys (pointer at column n_heads * d, n_kv_heads local kv heads); values are not rotated.
// Token t = b * seq + s sits at position s.
#pragma once

#include <cstdint>

#include "dtrain/common/rope_scaling.h"

namespace dtrain::kernels {

struct RopeShape {
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::int64_t n_heads = 0;     // heads rotated by this call (local query heads, or local kv heads)
  std::int64_t head_dim = 0;    // d, even
  std::int64_t row_stride = 0;  // floats between token t and t + 1 (>= n_heads * head_dim)
};

// Fills cos[p, i] and sin[p, i] for p in [0, seq), i in [0, head_dim / 2) ([seq, head_dim / 2], row-major). The
// angle and its cosine and sine are computed in float64 and rounded once to float, so the table is exact to half an
// ulp at every position (a float32 angle, as Hugging Face computes it, loses about p * 6e-8 radians). Throws
// dtrain::Error (input) when head_dim is odd or not positive, seq is negative or theta <= 0. With `scaling` (HF's
// llama3, linear or yarn), each frequency theta^(-2i/head_dim) is scaled first and cos and sin are multiplied by its
// attention scale (yarn's; dtrain/common/rope_scaling.h).
void rope_table(double theta, std::int64_t seq, std::int64_t head_dim, float* cos, float* sin,
                const RopeScaling& scaling = {});

namespace cpu {

// In place: x <- rotate(x, +angle) for every head of every token.
void rope_forward(const RopeShape& shape, const float* cos, const float* sin, float* x);
// In place: dx <- rotate(dx, -angle), the transpose of the forward rotation.
void rope_backward(const RopeShape& shape, const float* cos, const float* sin, float* dx);

}  // namespace cpu
}  // namespace dtrain::kernels
