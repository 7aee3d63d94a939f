// Fused causal attention (FlashAttention-2's algorithm, Dao 2023) forward and backward, fp32 tiles in shared memory,
// and the entry points, which hand the shapes the tensor-core kernels take to attention_mma.cu (attention.h).
//
// Every kernel works on 64 x 64 tiles with 256 threads arranged 16 x 16: thread (ty, tx) owns rows ty + 16 i (i < 4)
// and columns tx + 16 j of each tile product, so a 64 x 64 score tile is a 4 x 4 register tile per thread and a
// 64 x d output a 4 x (d / 16) one. Operands are converted from bf16 to fp32 once, when a tile is loaded; rows past the
// end of the sequence load as zeros and are masked like keys above the diagonal. Each output element has exactly one
// writer and every sum runs in a fixed order, so results are bitwise repeatable (context.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>

#include "cuda/attention_mma.h"
#include "cuda/check.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/attention.h"

namespace dtrain::kernels::cuda {

namespace {

using detail::as_device;
using detail::kThreads;
using detail::stream_of;

constexpr int kTile = 64;            // query rows and keys per tile
constexpr int kScoreLd = kTile + 1;  // row pitch of the score tiles in shared memory (odd: no bank conflicts)
constexpr float kNegInf = -__builtin_huge_valf();

static_assert(kThreads == 256, "the tile kernels arrange their threads 16 x 16");

// Everything the kernels need besides the pointers; strides in elements.
struct Geometry {
  std::int64_t seq;
  std::int64_t n_heads;
  std::int64_t group;  // query heads per kv head
  std::int64_t q_stride;
  std::int64_t kv_stride;
  std::int64_t o_stride;  // n_heads * head_dim (o and dout)
  float scale;            // 1 / sqrt(head_dim)
  bool dropout;
  detail::DeviceDropout drop;
  std::int64_t sample_begin, head_begin, total_heads;
};

// The Philox scale (0 or 1 / (1 - p)) of probability (b, h, i, j): attention.h's global element index.
__device__ __forceinline__ float dropout_at(const Geometry& g, std::int64_t b, std::int64_t h, std::int64_t i,
                                            std::int64_t j) {
  const std::int64_t head = (g.sample_begin + b) * g.total_heads + g.head_begin + h;
  return detail::dropout_scale(g.drop, static_cast<std::uint64_t>((head * g.seq + i) * g.seq + j));
}

// dst[r * ld + c] = src[(row0 + r) * stride + c] as fp32 for r < kTile, c < kD; zeros for rows >= seq.
template <int kD>
__device__ __forceinline__ void load_tile(const __nv_bfloat16* src, std::int64_t stride, std::int64_t row0,
                                          std::int64_t seq, float* dst) {
  constexpr int kLd = kD + 1;
  for (int idx = static_cast<int>(threadIdx.x); idx < kTile * kD; idx += kThreads) {
    const int r = idx / kD;
    const int c = idx % kD;
    const std::int64_t row = row0 + r;
    dst[r * kLd + c] = row < seq ? __bfloat162float(src[row * stride + c]) : 0.0f;
  }
}

// out[i][j] += sum_{k < kInner} A(ty + 16 i, k) * B(k, tx + 16 j), with A(r, k) = a[r * a_row + k * a_inner] and
// B(k, c) = b[k * b_inner + c * b_col] in shared memory. k runs in order: each output is summed in a fixed order.
template <int kCols, int kInner>
__device__ __forceinline__ void tile_product(const float* a, int a_row, int a_inner, const float* b, int b_inner,
                                             int b_col, float (&out)[4][kCols]) {
  const int tx = static_cast<int>(threadIdx.x % 16);
  const int ty = static_cast<int>(threadIdx.x / 16);
#pragma unroll 4
  for (int k = 0; k < kInner; ++k) {
    float av[4];
    float bv[kCols];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = a[(ty + 16 * i) * a_row + k * a_inner];
#pragma unroll
    for (int j = 0; j < kCols; ++j) bv[j] = b[k * b_inner + (tx + 16 * j) * b_col];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < kCols; ++j) out[i][j] = fmaf(av[i], bv[j], out[i][j]);
    }
  }
}

template <int kRows, int kCols>
__device__ __forceinline__ void zero(float (&x)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) x[i][j] = 0.0f;
  }
}

// Shared memory of each kernel, in floats.
template <int kD>
constexpr int forward_smem_floats() {
  return 3 * kTile * (kD + 1) + kTile * kScoreLd + 3 * kTile;
}
template <int kD>
constexpr int dq_smem_floats() {
  return 4 * kTile * (kD + 1) + kTile * kScoreLd + 2 * kTile;
}
template <int kD>
constexpr int dkv_smem_floats() {
  return 4 * kTile * (kD + 1) + 2 * kTile * kScoreLd + 2 * kTile;
}

// ---- forward ------------------------------------------------------------------------------------------------------

// Block (query block, query head h, sequence b). Query blocks run in reverse order: the last ones have the most key
// tiles and start first, so the short blocks fill the tail of the grid.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(Geometry g, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                             __nv_bfloat16* o, float* lse) {
  constexpr int kLd = kD + 1;
  constexpr int kCols = kD / 16;
  extern __shared__ float smem[];
  float* qs = smem;              // Q tile [kTile][kLd]
  float* ks = qs + kTile * kLd;  // K tile
  float* vs = ks + kTile * kLd;  // V tile
  float* ss = vs + kTile * kLd;  // scores, then probabilities [kTile][kScoreLd]
  float* row_m = ss + kTile * kScoreLd;
  float* row_l = row_m + kTile;
  float* row_corr = row_l + kTile;

  const std::int64_t i0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;
  const std::int64_t h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const std::int64_t kvh = h / g.group;
  const std::int64_t i1 = i0 + kTile < g.seq ? i0 + kTile : g.seq;
  const int tx = static_cast<int>(threadIdx.x % 16);
  const int ty = static_cast<int>(threadIdx.x / 16);
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);

  const __nv_bfloat16* kb = k + b * g.seq * g.kv_stride + kvh * kD;
  const __nv_bfloat16* vb = v + b * g.seq * g.kv_stride + kvh * kD;
  load_tile<kD>(q + b * g.seq * g.q_stride + h * kD, g.q_stride, i0, g.seq, qs);
  if (threadIdx.x < kTile) {
    row_m[threadIdx.x] = kNegInf;
    row_l[threadIdx.x] = 0.0f;
  }
  float acc[4][kCols];
  zero(acc);

  for (std::int64_t j0 = 0; j0 < i1; j0 += kTile) {
    __syncthreads();  // the previous tile's readers are done with ks, vs and ss
    load_tile<kD>(kb, g.kv_stride, j0, g.seq, ks);
    load_tile<kD>(vb, g.kv_stride, j0, g.seq, vs);
    __syncthreads();
    float s[4][4];
    zero(s);
    tile_product<4, kD>(qs, kLd, 1, ks, 1, kLd, s);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = ty + 16 * i;
        const int c = tx + 16 * j;
        const bool visible = i0 + r < g.seq && j0 + c <= i0 + r;
        ss[r * kScoreLd + c] = visible ? s[i][j] * g.scale : kNegInf;
      }
    }
    __syncthreads();
    // Online softmax (FlashAttention Algorithm 1, lines 9-12), one warp per row, each lane two keys.
    for (int r = warp; r < kTile; r += kThreads / 32) {
      const float s0 = ss[r * kScoreLd + lane];
      const float s1 = ss[r * kScoreLd + lane + 32];
      const float m_old = row_m[r];
      const float m_new = fmaxf(m_old, detail::warp_reduce(fmaxf(s0, s1), detail::MaxOp{}));
      float p0 = 0.0f;
      float p1 = 0.0f;
      float corr = 1.0f;
      if (m_new != kNegInf) {  // a row with no visible key yet (or past the sequence) stays empty
        p0 = expf(s0 - m_new);
        p1 = expf(s1 - m_new);
        corr = expf(m_old - m_new);
      }
      const float sum = detail::warp_reduce(p0 + p1, detail::SumOp{});
      // The running sum takes the probabilities before dropout; the output accumulates the dropped ones (as the CPU).
      if (g.dropout) {
        if (p0 != 0.0f) p0 *= dropout_at(g, b, h, i0 + r, j0 + lane);
        if (p1 != 0.0f) p1 *= dropout_at(g, b, h, i0 + r, j0 + lane + 32);
      }
      ss[r * kScoreLd + lane] = p0;
      ss[r * kScoreLd + lane + 32] = p1;
      if (lane == 0) {
        row_l[r] = row_l[r] * corr + sum;
        row_m[r] = m_new;
        row_corr[r] = corr;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float corr = row_corr[ty + 16 * i];
#pragma unroll
      for (int j = 0; j < kCols; ++j) acc[i][j] *= corr;
    }
    tile_product<kCols, kTile>(ss, kScoreLd, 1, vs, kLd, 1, acc);
  }
  __syncthreads();

  __nv_bfloat16* ob = o + b * g.seq * g.o_stride + h * kD;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (i0 + r >= g.seq) continue;
    const float inv = 1.0f / row_l[r];
#pragma unroll
    for (int j = 0; j < kCols; ++j) ob[(i0 + r) * g.o_stride + tx + 16 * j] = __float2bfloat16(acc[i][j] * inv);
  }
  if (threadIdx.x < kTile && i0 + threadIdx.x < g.seq) {
    lse[(b * g.n_heads + h) * g.seq + i0 + threadIdx.x] = row_m[threadIdx.x] + logf(row_l[threadIdx.x]);
  }
}

// ---- backward -----------------------------------------------------------------------------------------------------

// delta[(b, h, i)] = dO[b, i, h, :] . O[b, i, h, :] (FlashAttention's D), one warp per row.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(Geometry g, std::int64_t rows, const __nv_bfloat16* o, const __nv_bfloat16* dout,
                           float* delta) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const std::int64_t i = row % g.seq;
  const std::int64_t h = (row / g.seq) % g.n_heads;
  const std::int64_t b = row / (g.seq * g.n_heads);
  const std::int64_t offset = (b * g.seq + i) * g.o_stride + h * kD;
  float s = 0.0f;
  for (int c = lane; c < kD; c += 32) s += __bfloat162float(dout[offset + c]) * __bfloat162float(o[offset + c]);
  s = detail::warp_reduce(s, detail::SumOp{});
  if (lane == 0) delta[row] = s;
}

// For a (query rows) x (keys) tile at (i0, j0) of head h: P = exp(scale * S - lse), dS = P o (dP o Z - D), where S
// and dP are this thread's 4 x 4 register tiles and Z the dropout scales. Writes dS to ds and, when pz is not
// nullptr, P o Z to pz (both [kTile][kScoreLd], row = query). Masked and out-of-range entries get 0.
__device__ __forceinline__ void softmax_backward_tile(const Geometry& g, std::int64_t b, std::int64_t h,
                                                      std::int64_t i0, std::int64_t j0, const float (&s)[4][4],
                                                      const float (&dp)[4][4], const float* row_lse,
                                                      const float* row_delta, float* ds, float* pz) {
  const int tx = static_cast<int>(threadIdx.x % 16);
  const int ty = static_cast<int>(threadIdx.x / 16);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = ty + 16 * i;
      const int c = tx + 16 * j;
      const std::int64_t qi = i0 + r;
      const std::int64_t kj = j0 + c;
      float p = 0.0f;
      float d = 0.0f;
      if (qi < g.seq && kj <= qi) {
        p = expf(s[i][j] * g.scale - row_lse[r]);
        const float z = g.dropout ? dropout_at(g, b, h, qi, kj) : 1.0f;
        d = p * (dp[i][j] * z - row_delta[r]);
        p *= z;
      }
      ds[r * kScoreLd + c] = d;
      if (pz != nullptr) pz[r * kScoreLd + c] = p;
    }
  }
}

// lse and delta of query rows [i0, i0 + kTile) of head h (0 past the sequence; those rows are masked).
__device__ __forceinline__ void load_row_stats(const Geometry& g, std::int64_t b, std::int64_t h, std::int64_t i0,
                                               const float* lse, const float* delta, float* row_lse, float* row_delta) {
  if (threadIdx.x < kTile) {
    const std::int64_t i = i0 + threadIdx.x;
    const std::int64_t at = (b * g.n_heads + h) * g.seq + i;
    row_lse[threadIdx.x] = i < g.seq ? lse[at] : 0.0f;
    row_delta[threadIdx.x] = i < g.seq ? delta[at] : 0.0f;
  }
}

// dQ of block (query block, query head h, sequence b): dQ = scale * sum over key tiles up to the diagonal of dS K.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(Geometry g, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                        const float* lse, const float* delta, const __nv_bfloat16* dout, __nv_bfloat16* dq) {
  constexpr int kLd = kD + 1;
  constexpr int kCols = kD / 16;
  extern __shared__ float smem[];
  float* qs = smem;
  float* dos = qs + kTile * kLd;
  float* ks = dos + kTile * kLd;
  float* vs = ks + kTile * kLd;
  float* dss = vs + kTile * kLd;  // dS [kTile][kScoreLd]
  float* row_lse = dss + kTile * kScoreLd;
  float* row_delta = row_lse + kTile;

  const std::int64_t i0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;
  const std::int64_t h = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const std::int64_t kvh = h / g.group;
  const std::int64_t i1 = i0 + kTile < g.seq ? i0 + kTile : g.seq;
  const int tx = static_cast<int>(threadIdx.x % 16);
  const int ty = static_cast<int>(threadIdx.x / 16);

  const __nv_bfloat16* kb = k + b * g.seq * g.kv_stride + kvh * kD;
  const __nv_bfloat16* vb = v + b * g.seq * g.kv_stride + kvh * kD;
  load_tile<kD>(q + b * g.seq * g.q_stride + h * kD, g.q_stride, i0, g.seq, qs);
  load_tile<kD>(dout + b * g.seq * g.o_stride + h * kD, g.o_stride, i0, g.seq, dos);
  load_row_stats(g, b, h, i0, lse, delta, row_lse, row_delta);
  float acc[4][kCols];
  zero(acc);

  for (std::int64_t j0 = 0; j0 < i1; j0 += kTile) {
    __syncthreads();
    load_tile<kD>(kb, g.kv_stride, j0, g.seq, ks);
    load_tile<kD>(vb, g.kv_stride, j0, g.seq, vs);
    __syncthreads();
    float s[4][4];
    float dp[4][4];
    zero(s);
    zero(dp);
    tile_product<4, kD>(qs, kLd, 1, ks, 1, kLd, s);    // Q K^T
    tile_product<4, kD>(dos, kLd, 1, vs, 1, kLd, dp);  // dO V^T
    softmax_backward_tile(g, b, h, i0, j0, s, dp, row_lse, row_delta, dss, nullptr);
    __syncthreads();
    tile_product<kCols, kTile>(dss, kScoreLd, 1, ks, kLd, 1, acc);  // dS K
  }

  __nv_bfloat16* dqb = dq + b * g.seq * g.q_stride + h * kD;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (i0 + r >= g.seq) continue;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      dqb[(i0 + r) * g.q_stride + tx + 16 * j] = __float2bfloat16(acc[i][j] * g.scale);
    }
  }
}

// dK and dV of block (key block, kv head, sequence b), summed over the kv head's query heads in order and, for each,
// over the query tiles from the diagonal down: dV = sum (P o Z)^T dO, dK = scale * sum dS^T Q.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    attention_dkv_kernel(Geometry g, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                         const float* lse, const float* delta, const __nv_bfloat16* dout, __nv_bfloat16* dk,
                         __nv_bfloat16* dv) {
  constexpr int kLd = kD + 1;
  constexpr int kCols = kD / 16;
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + kTile * kLd;
  float* qs = vs + kTile * kLd;
  float* dos = qs + kTile * kLd;
  float* pzs = dos + kTile * kLd;       // P o Z [kTile][kScoreLd], row = query
  float* dss = pzs + kTile * kScoreLd;  // dS, row = query
  float* row_lse = dss + kTile * kScoreLd;
  float* row_delta = row_lse + kTile;

  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.x) * kTile;  // the first key blocks have the most work
  const std::int64_t kvh = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int tx = static_cast<int>(threadIdx.x % 16);
  const int ty = static_cast<int>(threadIdx.x / 16);

  load_tile<kD>(k + b * g.seq * g.kv_stride + kvh * kD, g.kv_stride, j0, g.seq, ks);
  load_tile<kD>(v + b * g.seq * g.kv_stride + kvh * kD, g.kv_stride, j0, g.seq, vs);
  float dk_acc[4][kCols];
  float dv_acc[4][kCols];
  zero(dk_acc);
  zero(dv_acc);

  for (std::int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    const __nv_bfloat16* qb = q + b * g.seq * g.q_stride + h * kD;
    const __nv_bfloat16* dob = dout + b * g.seq * g.o_stride + h * kD;
    for (std::int64_t i0 = j0; i0 < g.seq; i0 += kTile) {  // query tiles at or below the diagonal
      __syncthreads();
      load_tile<kD>(qb, g.q_stride, i0, g.seq, qs);
      load_tile<kD>(dob, g.o_stride, i0, g.seq, dos);
      load_row_stats(g, b, h, i0, lse, delta, row_lse, row_delta);
      __syncthreads();
      float s[4][4];
      float dp[4][4];
      zero(s);
      zero(dp);
      tile_product<4, kD>(qs, kLd, 1, ks, 1, kLd, s);
      tile_product<4, kD>(dos, kLd, 1, vs, 1, kLd, dp);
      softmax_backward_tile(g, b, h, i0, j0, s, dp, row_lse, row_delta, dss, pzs);
      __syncthreads();
      // Transposed tiles: A(key r, query k) = tile[k * kScoreLd + r].
      tile_product<kCols, kTile>(pzs, 1, kScoreLd, dos, kLd, 1, dv_acc);
      tile_product<kCols, kTile>(dss, 1, kScoreLd, qs, kLd, 1, dk_acc);
    }
  }

  __nv_bfloat16* dkb = dk + b * g.seq * g.kv_stride + kvh * kD;
  __nv_bfloat16* dvb = dv + b * g.seq * g.kv_stride + kvh * kD;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (j0 + r >= g.seq) continue;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const std::int64_t at = (j0 + r) * g.kv_stride + tx + 16 * j;
      dkb[at] = __float2bfloat16(dk_acc[i][j] * g.scale);
      dvb[at] = __float2bfloat16(dv_acc[i][j]);
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------------------------

Geometry make_geometry(const AttentionShape& s, const AttentionDropout* dropout) {
  DTRAIN_CHECK(s.batch >= 0 && s.seq >= 0 && s.head_dim > 0, "attention: negative or empty dimensions");
  DTRAIN_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0, "attention: n_kv_heads must divide n_heads");
  DTRAIN_CHECK(s.q_stride >= s.n_heads * s.head_dim, "attention: q_stride smaller than the query heads");
  DTRAIN_CHECK(s.kv_stride >= s.n_kv_heads * s.head_dim, "attention: kv_stride smaller than the kv heads");
  if (!attention_supports_head_dim(s.head_dim)) {
    throw input_error("attention: head_dim = " + std::to_string(s.head_dim) +
                      " is not supported by the CUDA kernels (supported: 16, 32, 64, 128)");
  }
  DTRAIN_CHECK(s.n_heads <= 65535 && s.batch <= 65535, "attention: too many heads or sequences for one launch");
  Geometry g{};
  g.seq = s.seq;
  g.n_heads = s.n_heads;
  g.group = s.n_heads / s.n_kv_heads;
  g.q_stride = s.q_stride;
  g.kv_stride = s.kv_stride;
  g.o_stride = s.n_heads * s.head_dim;
  g.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));  // as the CPU backend
  if (dropout != nullptr && dropout->p != 0.0f) {
    DTRAIN_CHECK(dropout->p > 0.0f && dropout->p < 1.0f, "attention dropout probability must be in [0, 1)");
    check_dropout_key(dropout->key);
    g.dropout = true;
    g.drop = detail::make_device_dropout(dropout->key, dropout->p);
    g.sample_begin = dropout->sample_begin;
    g.head_begin = dropout->head_begin;
    g.total_heads = dropout->total_heads;
  }
  return g;
}

// Allows `kernel` the dynamic shared memory it needs (above 48 KB a kernel must opt in).
template <class Kernel>
void allow_smem(Kernel kernel, int floats) {
  DTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         floats * static_cast<int>(sizeof(float))));
}

std::size_t smem_bytes(int floats) { return static_cast<std::size_t>(floats) * sizeof(float); }

template <int kD>
void forward_impl(Context& ctx, const AttentionShape& s, const Geometry& g, const bf16* q, const bf16* k, const bf16* v,
                  bf16* o, float* lse) {
  constexpr int kSmem = forward_smem_floats<kD>();
  allow_smem(attention_forward_kernel<kD>, kSmem);
  const dim3 grid(detail::checked_grid((s.seq + kTile - 1) / kTile), static_cast<unsigned>(s.n_heads),
                  static_cast<unsigned>(s.batch));
  attention_forward_kernel<kD><<<grid, kThreads, smem_bytes(kSmem), stream_of(ctx)>>>(g, as_device(q), as_device(k),
                                                                                      as_device(v), as_device(o), lse);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "attention_forward");
}

template <int kD>
void backward_impl(Context& ctx, const AttentionShape& s, const Geometry& g, const bf16* q, const bf16* k,
                   const bf16* v, const bf16* o, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv) {
  const std::int64_t rows = s.batch * s.n_heads * s.seq;
  DeviceBuffer<float> delta = allocate<float>(ctx, static_cast<std::size_t>(rows));
  constexpr std::int64_t kRowsPerBlock = kThreads / 32;
  attention_delta_kernel<kD>
      <<<detail::checked_grid((rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, stream_of(ctx)>>>(
          g, rows, as_device(o), as_device(dout), delta.data());
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "attention_backward (delta)");

  const unsigned blocks = detail::checked_grid((s.seq + kTile - 1) / kTile);
  constexpr int kDqSmem = dq_smem_floats<kD>();
  allow_smem(attention_dq_kernel<kD>, kDqSmem);
  attention_dq_kernel<kD><<<dim3(blocks, static_cast<unsigned>(s.n_heads), static_cast<unsigned>(s.batch)), kThreads,
                            smem_bytes(kDqSmem), stream_of(ctx)>>>(g, as_device(q), as_device(k), as_device(v), lse,
                                                                   delta.data(), as_device(dout), as_device(dq));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "attention_backward (dq)");

  constexpr int kDkvSmem = dkv_smem_floats<kD>();
  allow_smem(attention_dkv_kernel<kD>, kDkvSmem);
  attention_dkv_kernel<kD><<<dim3(blocks, static_cast<unsigned>(s.n_kv_heads), static_cast<unsigned>(s.batch)),
                             kThreads, smem_bytes(kDkvSmem), stream_of(ctx)>>>(
      g, as_device(q), as_device(k), as_device(v), lse, delta.data(), as_device(dout), as_device(dk), as_device(dv));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "attention_backward (dk, dv)");
  // `delta` returns to the pool here; stream ordering keeps it intact until the kernels have run (memory.h).
}

// kAuto's choice, from DTRAIN_ATTENTION_KERNEL at the first call that needs it (a bad value throws at every call).
AttentionKernel environment_kernel() {
  static const AttentionKernel kernel = attention_kernel_from_environment();
  return kernel;
}

// Whether the tensor-core kernels compute this call (after make_geometry's checks).
bool use_mma(AttentionKernel kernel, const AttentionShape& s, const AttentionDropout* dropout,
             std::initializer_list<const void*> tensors) {
  if (kernel == AttentionKernel::kAuto) kernel = environment_kernel();
  if (kernel == AttentionKernel::kSimt) return false;
  bool applies = detail::attention_mma_supports(s, dropout);
  for (const void* t : tensors) applies = applies && detail::attention_mma_aligned(t);
  if (kernel == AttentionKernel::kMma && !applies) {
    throw input_error(
        "attention: the tensor-core kernels (AttentionKernel::kMma) need head_dim 64 or 128, no dropout, "
        "q and kv strides that are multiples of 8 and 16-byte aligned tensors; got head_dim = " +
        std::to_string(s.head_dim) + ", dropout p = " + std::to_string(dropout != nullptr ? dropout->p : 0.0f) +
        ", q_stride = " + std::to_string(s.q_stride) + ", kv_stride = " + std::to_string(s.kv_stride) +
        " (AttentionKernel::kAuto falls back to the fp32 kernels)");
  }
  return applies;
}

}  // namespace

AttentionKernel attention_kernel_from_environment() {
  const char* value = std::getenv("DTRAIN_ATTENTION_KERNEL");
  if (value == nullptr || *value == '\0') return AttentionKernel::kAuto;
  const std::string_view v(value);
  if (v == "mma") return AttentionKernel::kAuto;
  if (v == "simt") return AttentionKernel::kSimt;
  throw input_error(std::string("DTRAIN_ATTENTION_KERNEL=") + value +
                    ": expected mma (tensor cores where they apply, the default) or simt (the fp32 kernels)");
}

bool attention_supports_head_dim(std::int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

void attention_forward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                       float* lse, const AttentionDropout* dropout, AttentionKernel kernel) {
  const Geometry g = make_geometry(shape, dropout);
  const bool mma = use_mma(kernel, shape, dropout, {q, k, v, o});
  if (shape.batch == 0 || shape.seq == 0 || shape.n_heads == 0) return;
  if (mma) return detail::attention_mma_forward(ctx, shape, q, k, v, o, lse);
  switch (shape.head_dim) {
    case 16:
      return forward_impl<16>(ctx, shape, g, q, k, v, o, lse);
    case 32:
      return forward_impl<32>(ctx, shape, g, q, k, v, o, lse);
    case 64:
      return forward_impl<64>(ctx, shape, g, q, k, v, o, lse);
    default:
      return forward_impl<128>(ctx, shape, g, q, k, v, o, lse);
  }
}

void attention_backward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* o, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                        const AttentionDropout* dropout, AttentionKernel kernel) {
  const Geometry g = make_geometry(shape, dropout);
  const bool mma = use_mma(kernel, shape, dropout, {q, k, v, o, dout, dq, dk, dv});
  if (shape.batch == 0 || shape.seq == 0 || shape.n_heads == 0) return;
  if (mma) return detail::attention_mma_backward(ctx, shape, q, k, v, o, lse, dout, dq, dk, dv);
  switch (shape.head_dim) {
    case 16:
      return backward_impl<16>(ctx, shape, g, q, k, v, o, lse, dout, dq, dk, dv);
    case 32:
      return backward_impl<32>(ctx, shape, g, q, k, v, o, lse, dout, dq, dk, dv);
    case 64:
      return backward_impl<64>(ctx, shape, g, q, k, v, o, lse, dout, dq, dk, dv);
    default:
      return backward_impl<128>(ctx, shape, g, q, k, v, o, lse, dout, dq, dk, dv);
  }
}

}  // namespace dtrain::kernels::cuda
