// Fused causal attention on tensor cores: FlashAttention-2 (Dao 2023) forward and backward with
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (bf16 operands, fp32 accumulators), head_dim 64 and 128,
// no dropout. The algorithm, the outputs and the split of the backward into a dQ kernel and a dK/dV kernel are
// attention.cu's; what changes is how a tile product is computed.
//
// Every kernel runs 8 warps and gives each warp 16 rows of every product it computes, so a warp never exchanges
// partial results with another: the score tile's accumulator fragments (fp32) are turned into probabilities in
// registers and, rounded to bf16, are directly the A operand of the next product (the m16n8k16 accumulator layout of
// two neighbouring 8-column tiles is the A layout of one 16-column block), as FlashAttention-2 does.
//   forward: CTA = 128 query rows (warp w: rows 16w..16w+15) x one head; K/V tiles of 64 keys, double-buffered with
//            cp.async; Q fragments kept in registers; online softmax in exp2 with the scale folded in.
//   dQ:      CTA = 128 query rows x one head, K/V tiles of 64 keys double-buffered; S = Q K^T and dP = dO V^T per tile,
//            dS = P o (dP - D), dQ += dS K.
//   dK/dV:   CTA = 128 keys (warp w: keys 16w..16w+15) x one kv head; Q/dO tiles of 32 (head_dim 128) or 64 query
//            rows (with their lse and D) double-buffered, over the kv head's query heads in order and, for each, the
//            query tiles from the diagonal down. The transposed products are computed directly: S^T = K Q^T and dP^T =
//            V dO^T, whose rows are keys, so that P^T and dS^T are A operands of dV += P^T dO and dK += dS^T Q.
// Tiles live in shared memory as bf16 rows padded by 8 elements (16 bytes): the eight 16-byte rows that one ldmatrix
// phase reads then start in eight different bank quads (pitch 272 or 144 bytes = 4 banks mod 32), and so do the
// cp.async writes. Rows past the end of the sequence are zero-filled by the copies and masked like keys above the
// diagonal. Each output element has one writer and every sum runs in a fixed order (the mma's own order, then tiles
// in loop order), so results are bitwise repeatable.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .bf16), with g = lane / 4, t = lane % 4:
//   A (16 x 16, row-major): a0 = (row g, cols 2t, 2t+1), a1 = (row g+8, cols 2t, 2t+1), a2 = (row g, cols 2t+8, 2t+9),
//                           a3 = (row g+8, cols 2t+8, 2t+9); each register two bf16, the lower column in the low half.
//   B (16 x 8, "col"):      b0 = (rows k = 2t, 2t+1, col n = g), b1 = (rows k = 2t+8, 2t+9, col n = g).
//   C/D (16 x 8, fp32):     c0 = (g, 2t), c1 = (g, 2t+1), c2 = (g+8, 2t), c3 = (g+8, 2t+1).
// ldmatrix.x4 loads four 8 x 8 bf16 matrices whose rows are addressed by lanes 0-7, 8-15, 16-23, 24-31; register i of
// lane l receives (row l / 4, cols 2 (l % 4), 2 (l % 4) + 1) of matrix i, and with .trans (rows 2 (l % 4),
// 2 (l % 4) + 1, col l / 4), i.e. the transposed matrix. All loads below give ldmatrix the same addresses for a 16 x 16
// block (frag_ptr: lane l points at row l % 16, column 8 (l / 16)), so the four matrices are (rows 0-7, cols 0-7),
// (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15); what the registers are depends on how the
// block is stored (load_a, load_b_nk, load_b_kn).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "cuda/attention_mma.h"
#include "cuda/check.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"

namespace dtrain::kernels::cuda::detail {

namespace {

constexpr int kWarps = 8;
constexpr int kCtaThreads = 32 * kWarps;
constexpr int kPad = 8;          // bf16 elements after each shared-memory row (see the file comment)
constexpr int kQueryRows = 128;  // forward and dQ: query rows per CTA, 16 per warp
constexpr int kKeyTile = 64;     // forward and dQ: keys per K/V tile
constexpr int kKeyRows = 128;    // dK/dV: keys per CTA, 16 per warp
// dK/dV: query rows per Q/dO tile. 32 for head_dim 128: the dK and dV accumulators take 128 registers per thread
// there, and S^T and dP^T of 64 queries would take 64 more (ptxas 13.0 then needs 250 of the 255 registers, against
// 237 with 32 rows, and spilled with earlier versions of the loop): 32 keeps a margin.
template <int kD>
constexpr int kDkvQueryTile = kD == 128 ? 32 : 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

static_assert(kQueryRows == 16 * kWarps && kKeyRows == 16 * kWarps, "each warp owns 16 rows of the CTA's block");
static_assert(kKeyTile % 16 == 0 && kDkvQueryTile<64> % 16 == 0 && kDkvQueryTile<128> % 16 == 0,
              "tiles are whole 16-column blocks of the products");

// Everything the kernels need besides the pointers; strides in elements.
struct MmaGeometry {
  std::int64_t seq;
  std::int64_t n_heads;
  std::int64_t group;  // query heads per kv head
  std::int64_t q_stride;
  std::int64_t kv_stride;
  std::int64_t o_stride;  // n_heads * head_dim (o and dout)
  float scale;            // 1 / sqrt(head_dim), as attention.cu and the CPU backend
  float scale_log2;       // scale * log2(e): exp(scale * x) = exp2(scale_log2 * x)
};

// ---- PTX wrappers -------------------------------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, asynchronously; with valid == false nothing is read (source size 0) and the
// 16 bytes are zeros. src must be a mapped address either way (callers pass the tensor's base then).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// The same for 4 bytes (one float).
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

// d += A B for one 16 x 8 tile (fp32 accumulators in place).
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats rounded to bf16 (nearest, ties to even) in one register, lo in the low half: the element with the lower
// column index of an A fragment register.
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
  std::uint32_t bits;
  // __nv_bfloat162 is two bf16 in 4 bytes; its constructors make it non-trivial for clang, not different in memory.
  memcpy(&bits, &v, sizeof bits);  // NOLINT(bugprone-undefined-memory-manipulation)
  return bits;
}

// ---- fragments ----------------------------------------------------------------------------------------------------

// Lane's ldmatrix row address for the 16 x 16 block at (row0, col0) of a tile with row pitch kLd: row row0 + l % 16,
// column col0 + 8 (l / 16). Matrices: 0 = (rows 0-7, cols 0-7), 1 = (rows 8-15, cols 0-7), 2 = (rows 0-7, cols 8-15),
// 3 = (rows 8-15, cols 8-15) of the block.
template <int kLd>
__device__ __forceinline__ const __nv_bfloat16* frag_ptr(const __nv_bfloat16* tile, int row0, int col0, int lane) {
  return tile + (row0 + (lane & 15)) * kLd + col0 + (lane >> 4) * 8;
}

// A fragment of the 16 x 16 block (rows = m, columns = k) at (row0, col0) of a row-major tile. Matrix 0 gives lane
// (row g, cols 2t, 2t+1) = a0, matrix 1 (row g+8, cols 2t..) = a1, matrix 2 (row g, cols 8+2t..) = a2, matrix 3 = a3.
template <int kLd>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const __nv_bfloat16* tile, int row0, int col0, int lane) {
  ldmatrix_x4(a, frag_ptr<kLd>(tile, row0, col0, lane));
}

// B fragments of two 8-column tiles n0..n0+7 (b[0]) and n0+8..n0+15 (b[1]) over k0..k0+15, from a tile stored
// [n][k] (rows = n, k contiguous: K or V for S = Q K^T, Q or dO for S^T = K Q^T). Without transposition lane gets
// (row n = g, cols k = 2t, 2t+1) of each matrix, which is b0 of the matrix's n rows when its columns are k 0-7 and b1
// when they are k 8-15: matrix 0 = b0 of n0.., 1 = b0 of n0+8.., 2 = b1 of n0.., 3 = b1 of n0+8...
template <int kLd>
__device__ __forceinline__ void load_b_nk(std::uint32_t (&b)[2][2], const __nv_bfloat16* tile, int n0, int k0,
                                          int lane) {
  std::uint32_t r[4];
  ldmatrix_x4(r, frag_ptr<kLd>(tile, n0, k0, lane));
  b[0][0] = r[0];
  b[0][1] = r[2];
  b[1][0] = r[1];
  b[1][1] = r[3];
}

// The same from a tile stored [k][n] (rows = k, n contiguous: V for O = P V, K for dQ = dS K, dO and Q for the dK/dV
// products). Transposed, lane gets (rows k = 2t, 2t+1, col n = g) of each matrix: matrix 0 (k 0-7, n 0-7) = b0 of
// n0.., 1 (k 8-15, n 0-7) = b1 of n0.., 2 (k 0-7, n 8-15) = b0 of n0+8.., 3 = b1 of n0+8...
template <int kLd>
__device__ __forceinline__ void load_b_kn(std::uint32_t (&b)[2][2], const __nv_bfloat16* tile, int k0, int n0,
                                          int lane) {
  std::uint32_t r[4];
  ldmatrix_x4_trans(r, frag_ptr<kLd>(tile, k0, n0, lane));
  b[0][0] = r[0];
  b[0][1] = r[1];
  b[1][0] = r[2];
  b[1][1] = r[3];
}

// The A fragment of columns [16 kk, 16 kk + 16) of a 16-row accumulator tile, rounded to bf16, from its 8-column
// tiles lo = 2 kk and hi = 2 kk + 1: a0 = (row g, cols 2t, 2t+1) = lo's c0, c1; a1 = (row g+8, ..) = lo's c2, c3;
// a2 = (row g, cols 8+2t, 8+2t+1) = hi's c0, c1; a3 = hi's c2, c3.
__device__ __forceinline__ void accumulator_to_a(std::uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// The causal test for this thread's accumulator elements. Element e of 8-column tile n is (row r0 + g + 8 (e / 2),
// column c0 + 8 n + 2t + e % 2) of a 16-row tile, with offset = c0 - r0. Column minus row is then
// 8 n + e % 2 - limit[e / 2] with limit[h] = g + 8 h - offset - 2t, so the column is after the row exactly when
// 8 n + e % 2 > limit[h], and before it when 8 n + e % 2 < limit[h]: one compare with a constant per element (no
// 64-bit arithmetic or branch), and exact for every tile, also those entirely on one side of the diagonal.
__device__ __forceinline__ void causal_limits(int (&limit)[2], std::int64_t offset, int lane) {
  const int base = (lane >> 2) - static_cast<int>(offset) - 2 * (lane & 3);
  limit[0] = base;
  limit[1] = base + 8;
}

template <int kTiles>
__device__ __forceinline__ void zero(float (&x)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[i][e] = 0.0f;
  }
}

// ---- tiles --------------------------------------------------------------------------------------------------------

// Starts copying rows [row0, row0 + kRows) of a [seq, stride] bf16 tensor (columns [0, kD) from src, the head's first
// element) into dst with row pitch kD + kPad; rows at or past seq become zeros. All kCtaThreads threads take part,
// each with kRows * kD / 8 / kCtaThreads 16-byte chunks; consecutive threads take consecutive chunks of a row.
template <int kRows, int kD>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, std::int64_t stride,
                                          std::int64_t row0, std::int64_t seq) {
  constexpr int kLd = kD + kPad;
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kCtaThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kChunks / kCtaThreads; ++i) {
    const int chunk = i * kCtaThreads + static_cast<int>(threadIdx.x);
    const int r = chunk / kChunksPerRow;
    const int c = (chunk % kChunksPerRow) * 8;
    const std::int64_t row = row0 + r;
    const bool valid = row < seq;
    cp_async_16(dst + r * kLd + c, valid ? src + row * stride + c : src, valid);
  }
}

// Stores this thread's part of a 16 x kD accumulator tile (rows row0 + g and row0 + g + 8, columns 8 i + 2t and
// 8 i + 2t + 1 of tile i), multiplied by scale_lo (row g) or scale_hi (row g + 8) and rounded to bf16, into dst
// (row r at dst + r * stride); rows at or past seq are not written.
template <int kD>
__device__ __forceinline__ void store_rows(const float (&acc)[kD / 8][4], float scale_lo, float scale_hi,
                                           __nv_bfloat16* dst, std::int64_t stride, std::int64_t row0, std::int64_t seq,
                                           int lane) {
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t row = row0 + g + 8 * half;
    if (row >= seq) continue;
    const float scale = half == 0 ? scale_lo : scale_hi;
    __nv_bfloat16* out = dst + row * stride + 2 * t;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i) {
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * i) =
          __floats2bfloat162_rn(acc[i][2 * half] * scale, acc[i][2 * half + 1] * scale);
    }
  }
}

// Shared memory of each kernel, in bytes.
template <int kD>
constexpr int forward_smem_bytes() {
  return (kQueryRows + 4 * kKeyTile) * (kD + kPad) * 2;  // Q, 2 stages of K and V
}
template <int kD>
constexpr int dq_smem_bytes() {
  return (2 * kQueryRows + 4 * kKeyTile) * (kD + kPad) * 2;  // Q, dO, 2 stages of K and V
}
template <int kD>
constexpr int dkv_smem_bytes() {
  constexpr int kQueryTile = kDkvQueryTile<kD>;
  return (2 * kKeyRows + 4 * kQueryTile) * (kD + kPad) * 2 + 4 * kQueryTile * 4;  // K, V, 2 x (Q, dO, lse, D)
}

// ---- forward ------------------------------------------------------------------------------------------------------

// Block (query head h, sequence b, query block): blockIdx.z = 0 is the last query block, which has the most key
// tiles, so the grid (launched x fastest, then y, then z) starts the longest blocks first and the short ones fill the
// tail.
template <int kD>
__global__ void __launch_bounds__(kCtaThreads, 1)
    mma_forward_kernel(MmaGeometry g, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                       __nv_bfloat16* o, float* lse) {
  constexpr int kLd = kD + kPad;
  constexpr int kKeyTiles = kKeyTile / 8;  // 8-column tiles of S
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kQueryRows][kLd]
  __nv_bfloat16* ks = qs + kQueryRows * kLd;                   // 2 stages of [kKeyTile][kLd]
  __nv_bfloat16* vs = ks + 2 * kKeyTile * kLd;                 // 2 stages of [kKeyTile][kLd]

  const std::int64_t h = blockIdx.x;
  const std::int64_t b = blockIdx.y;
  const std::int64_t i0 = static_cast<std::int64_t>(gridDim.z - 1 - blockIdx.z) * kQueryRows;
  const std::int64_t kvh = h / g.group;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int gr = lane >> 2;                // the fragment layouts' g
  const int tg = lane & 3;                 // and t
  const std::int64_t w0 = i0 + 16 * warp;  // this warp's first query row
  const std::int64_t rows_end = i0 + kQueryRows < g.seq ? i0 + kQueryRows : g.seq;
  const int tiles = static_cast<int>((rows_end - 1) / kKeyTile + 1);  // key tiles up to the block's last row

  const __nv_bfloat16* kb = k + b * g.seq * g.kv_stride + kvh * kD;
  const __nv_bfloat16* vb = v + b * g.seq * g.kv_stride + kvh * kD;
  load_tile<kQueryRows, kD>(qs, q + b * g.seq * g.q_stride + h * kD, g.q_stride, i0, g.seq);
  cp_async_commit();
  load_tile<kKeyTile, kD>(ks, kb, g.kv_stride, 0, g.seq);
  load_tile<kKeyTile, kD>(vs, vb, g.kv_stride, 0, g.seq);
  cp_async_commit();
  cp_async_wait<1>();  // Q has landed (tile 0 may still be in flight)
  __syncthreads();
  std::uint32_t qa[kD / 16][4];  // the warp's 16 x kD block of Q as A fragments, for every tile
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) load_a<kLd>(qa[kk], qs, 16 * warp, 16 * kk, lane);

  float acc[kD / 8][4];
  zero(acc);
  // Running max of the raw scores q.k (unscaled) and this thread's part of the running sum, rows g and g + 8. The
  // sums of a row's four threads are added once, at the end.
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < tiles) {  // the other stage's readers passed the barrier that ended the previous iteration
      const std::int64_t next = static_cast<std::int64_t>(tile + 1) * kKeyTile;
      load_tile<kKeyTile, kD>(ks + (stage ^ 1) * kKeyTile * kLd, kb, g.kv_stride, next, g.seq);
      load_tile<kKeyTile, kD>(vs + (stage ^ 1) * kKeyTile * kLd, vb, g.kv_stride, next, g.seq);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const std::int64_t j0 = static_cast<std::int64_t>(tile) * kKeyTile;
    // A warp whose rows are all past the sequence, or all before the tile's first key, has nothing to add.
    if (w0 < g.seq && j0 <= w0 + 15) {
      const __nv_bfloat16* kt = ks + stage * kKeyTile * kLd;
      const __nv_bfloat16* vt = vs + stage * kKeyTile * kLd;
      float s[kKeyTiles][4];
      zero(s);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kKeyTiles / 2; ++np) {
          std::uint32_t kf[2][2];
          load_b_nk<kLd>(kf, kt, 16 * np, 16 * kk, lane);
          mma(s[2 * np], qa[kk], kf[0]);
          mma(s[2 * np + 1], qa[kk], kf[1]);
        }
      }
      // Keys above the diagonal get -inf (causal_limits: key column 8 n + e % 2 > last[e / 2]).
      int last[2];
      causal_limits(last, j0 - w0, lane);
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (8 * n + (e & 1) > last[e >> 1]) s[n][e] = kNegInf;
        }
      }
      // Online softmax (FlashAttention-2, Algorithm 1): the row max over the tile (a row's 64 keys are spread over
      // the four threads t of its group g: xor 1 and 2 stay in the group), the rescale of what came before, and
      // P = exp(scale (s - max)) = exp2(s scale_log2 - max scale_log2) with one FMA per element.
      float tile_max[2] = {row_max[0], row_max[1]};
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
      }
      float max_scaled[2];
      float correction[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        // Key 0 is visible to every row and tile 0 comes first, so the max is finite from the first tile on; the
        // guard keeps a row without visible keys at P = 0 instead of NaN all the same.
        max_scaled[r] = tile_max[r] == kNegInf ? 0.0f : tile_max[r] * g.scale_log2;
        correction[r] = exp2f(row_max[r] * g.scale_log2 - max_scaled[r]);  // 0 on the first tile (-inf - x)
        row_max[r] = tile_max[r];
      }
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2f(fmaf(s[n][e], g.scale_log2, -max_scaled[e >> 1]));
          s[n][e] = p;
          tile_sum[e >> 1] += p;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * correction[r] + tile_sum[r];
#pragma unroll
      for (int i = 0; i < kD / 8; ++i) {
        acc[i][0] *= correction[0];
        acc[i][1] *= correction[0];
        acc[i][2] *= correction[1];
        acc[i][3] *= correction[1];
      }
      // O += P V: P's accumulator fragments are the A operand (accumulator_to_a), V is stored [key][d] = [k][n].
#pragma unroll
      for (int kk = 0; kk < kKeyTile / 16; ++kk) {
        std::uint32_t pa[4];
        accumulator_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < kD / 16; ++np) {
          std::uint32_t vf[2][2];
          load_b_kn<kLd>(vf, vt, 16 * kk, 16 * np, lane);
          mma(acc[2 * np], pa, vf[0]);
          mma(acc[2 * np + 1], pa, vf[1]);
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before the next iteration refills it
  }

  if (w0 >= g.seq) return;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The row's four partial sums, added in the same butterfly on every lane (a + b == b + a): one value.
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    inv[r] = 1.0f / row_sum[r];
  }
  store_rows<kD>(acc, inv[0], inv[1], o + b * g.seq * g.o_stride + h * kD, g.o_stride, w0, g.seq, lane);
  if (tg == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int64_t row = w0 + gr + 8 * r;
      // lse = log sum_j exp(scale s_j) = scale max + log sum_j exp(scale (s_j - max)).
      if (row < g.seq) lse[(b * g.n_heads + h) * g.seq + row] = row_max[r] * g.scale + logf(row_sum[r]);
    }
  }
}

// ---- backward -----------------------------------------------------------------------------------------------------

// delta[(b, h, i)] = dO[b, i, h, :] . O[b, i, h, :] (FlashAttention's D): kD / 8 threads per row, each 8 elements
// (16-byte loads) summed in order, then the row's threads in a butterfly.
template <int kD>
__global__ void __launch_bounds__(kCtaThreads)
    mma_delta_kernel(MmaGeometry g, std::int64_t rows, const __nv_bfloat16* o, const __nv_bfloat16* dout,
                     float* delta) {
  constexpr int kLanes = kD / 8;
  constexpr int kRowsPerCta = kCtaThreads / kLanes;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kLanes;
  const int part = static_cast<int>(threadIdx.x % kLanes);
  float sum = 0.0f;
  if (row < rows) {
    const std::int64_t i = row % g.seq;
    const std::int64_t h = (row / g.seq) % g.n_heads;
    const std::int64_t b = row / (g.seq * g.n_heads);
    const std::int64_t offset = (b * g.seq + i) * g.o_stride + h * kD + 8 * part;
    const uint4 ov = *reinterpret_cast<const uint4*>(o + offset);
    const uint4 dv = *reinterpret_cast<const uint4*>(dout + offset);
    const std::uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w};
    const std::uint32_t dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      __nv_bfloat162 o2;
      __nv_bfloat162 d2;
      memcpy(&o2, &ow[w], sizeof o2);  // NOLINT(bugprone-undefined-memory-manipulation): see pack_bf16
      memcpy(&d2, &dw[w], sizeof d2);  // NOLINT(bugprone-undefined-memory-manipulation)
      const float2 of = __bfloat1622float2(o2);
      const float2 df = __bfloat1622float2(d2);
      sum += df.x * of.x;
      sum += df.y * of.y;
    }
  }
  // Every lane reaches the shuffles (rows past the end add zeros); xor offsets below kLanes stay within a row.
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (part == 0 && row < rows) delta[row] = sum;
}

// dQ of block (query head h, sequence b, query block; blockIdx.z = 0 the last): dQ = scale * sum over the key tiles
// up to the diagonal of dS K, dS = P o (dP - D), P = exp(scale S - lse), dP = dO V^T.
template <int kD>
__global__ void __launch_bounds__(kCtaThreads, 1)
    mma_dq_kernel(MmaGeometry g, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                  const float* lse, const float* delta, const __nv_bfloat16* dout, __nv_bfloat16* dq) {
  constexpr int kLd = kD + kPad;
  constexpr int kKeyTiles = kKeyTile / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kQueryRows][kLd]
  __nv_bfloat16* dos = qs + kQueryRows * kLd;                  // [kQueryRows][kLd]
  __nv_bfloat16* ks = dos + kQueryRows * kLd;                  // 2 stages of [kKeyTile][kLd]
  __nv_bfloat16* vs = ks + 2 * kKeyTile * kLd;                 // 2 stages of [kKeyTile][kLd]

  const std::int64_t h = blockIdx.x;
  const std::int64_t b = blockIdx.y;
  const std::int64_t i0 = static_cast<std::int64_t>(gridDim.z - 1 - blockIdx.z) * kQueryRows;
  const std::int64_t kvh = h / g.group;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int gr = lane >> 2;
  const std::int64_t w0 = i0 + 16 * warp;
  const std::int64_t rows_end = i0 + kQueryRows < g.seq ? i0 + kQueryRows : g.seq;
  const int tiles = static_cast<int>((rows_end - 1) / kKeyTile + 1);

  const __nv_bfloat16* kb = k + b * g.seq * g.kv_stride + kvh * kD;
  const __nv_bfloat16* vb = v + b * g.seq * g.kv_stride + kvh * kD;
  load_tile<kQueryRows, kD>(qs, q + b * g.seq * g.q_stride + h * kD, g.q_stride, i0, g.seq);
  load_tile<kQueryRows, kD>(dos, dout + b * g.seq * g.o_stride + h * kD, g.o_stride, i0, g.seq);
  cp_async_commit();
  load_tile<kKeyTile, kD>(ks, kb, g.kv_stride, 0, g.seq);
  load_tile<kKeyTile, kD>(vs, vb, g.kv_stride, 0, g.seq);
  cp_async_commit();

  // lse (in log2 units) and D of rows g and g + 8; rows past the sequence get 0 (they are computed, never stored).
  float lse2[2];
  float dd[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t row = w0 + gr + 8 * r;
    const std::int64_t at = (b * g.n_heads + h) * g.seq + row;
    lse2[r] = row < g.seq ? lse[at] * kLog2e : 0.0f;
    dd[r] = row < g.seq ? delta[at] : 0.0f;
  }
  float acc[kD / 8][4];
  zero(acc);

  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < tiles) {
      const std::int64_t next = static_cast<std::int64_t>(tile + 1) * kKeyTile;
      load_tile<kKeyTile, kD>(ks + (stage ^ 1) * kKeyTile * kLd, kb, g.kv_stride, next, g.seq);
      load_tile<kKeyTile, kD>(vs + (stage ^ 1) * kKeyTile * kLd, vb, g.kv_stride, next, g.seq);
      cp_async_commit();
      cp_async_wait<1>();  // Q, dO and this tile have landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const std::int64_t j0 = static_cast<std::int64_t>(tile) * kKeyTile;
    if (w0 < g.seq && j0 <= w0 + 15) {
      const __nv_bfloat16* kt = ks + stage * kKeyTile * kLd;
      const __nv_bfloat16* vt = vs + stage * kKeyTile * kLd;
      float s[kKeyTiles][4];
      float dp[kKeyTiles][4];
      zero(s);
      zero(dp);
      // S = Q K^T and dP = dO V^T: Q and dO are A operands ([row][d] = [m][k]), K and V are stored [key][d] = [n][k].
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        std::uint32_t qa[4];
        std::uint32_t da[4];
        load_a<kLd>(qa, qs, 16 * warp, 16 * kk, lane);
        load_a<kLd>(da, dos, 16 * warp, 16 * kk, lane);
#pragma unroll
        for (int np = 0; np < kKeyTiles / 2; ++np) {
          std::uint32_t kf[2][2];
          std::uint32_t vf[2][2];
          load_b_nk<kLd>(kf, kt, 16 * np, 16 * kk, lane);
          load_b_nk<kLd>(vf, vt, 16 * np, 16 * kk, lane);
          mma(s[2 * np], qa, kf[0]);
          mma(s[2 * np + 1], qa, kf[1]);
          mma(dp[2 * np], da, vf[0]);
          mma(dp[2 * np + 1], da, vf[1]);
        }
      }
      // dS = P o (dP - D) in place of S; keys above the diagonal have P = 0 (causal_limits).
      int last[2];
      causal_limits(last, j0 - w0, lane);
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = exp2f(fmaf(s[n][e], g.scale_log2, -lse2[e >> 1]));
          if (8 * n + (e & 1) > last[e >> 1]) p = 0.0f;
          s[n][e] = p * (dp[n][e] - dd[e >> 1]);
        }
      }
      // dQ += dS K: dS's accumulator fragments are the A operand, K is stored [key][d] = [k][n].
#pragma unroll
      for (int kk = 0; kk < kKeyTile / 16; ++kk) {
        std::uint32_t sa[4];
        accumulator_to_a(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < kD / 16; ++np) {
          std::uint32_t kf[2][2];
          load_b_kn<kLd>(kf, kt, 16 * kk, 16 * np, lane);
          mma(acc[2 * np], sa, kf[0]);
          mma(acc[2 * np + 1], sa, kf[1]);
        }
      }
    }
    __syncthreads();
  }

  if (w0 < g.seq) {
    store_rows<kD>(acc, g.scale, g.scale, dq + b * g.seq * g.q_stride + h * kD, g.q_stride, w0, g.seq, lane);
  }
}

// Starts loading iteration `it`'s Q and dO tiles and their lse and D into `stage` of the dK/dV kernel's buffers:
// query head kvh * group + it / qblocks, query rows from j0 + kQueryTile (it % qblocks). The first kQueryTile threads
// copy lse, the next kQueryTile D (zeros past the sequence).
template <int kD>
__device__ __forceinline__ void load_dkv_stage(const MmaGeometry& g, std::int64_t b, std::int64_t kvh, std::int64_t j0,
                                               int qblocks, int it, int stage, const __nv_bfloat16* q, const float* lse,
                                               const float* delta, const __nv_bfloat16* dout, __nv_bfloat16* qs,
                                               __nv_bfloat16* dos, float* lse_s, float* delta_s) {
  constexpr int kLd = kD + kPad;
  constexpr int kQueryTile = kDkvQueryTile<kD>;
  const std::int64_t h = kvh * g.group + it / qblocks;
  const std::int64_t i0 = j0 + (it % qblocks) * kQueryTile;
  load_tile<kQueryTile, kD>(qs + stage * kQueryTile * kLd, q + b * g.seq * g.q_stride + h * kD, g.q_stride, i0, g.seq);
  load_tile<kQueryTile, kD>(dos + stage * kQueryTile * kLd, dout + b * g.seq * g.o_stride + h * kD, g.o_stride, i0,
                            g.seq);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < 2 * kQueryTile) {
    const int r = tid % kQueryTile;
    const std::int64_t head_row0 = (b * g.n_heads + h) * g.seq;
    const bool valid = i0 + r < g.seq;
    const float* src = (tid < kQueryTile ? lse : delta) + head_row0;
    float* dst = (tid < kQueryTile ? lse_s : delta_s) + stage * kQueryTile + r;
    cp_async_4(dst, valid ? src + i0 + r : src, valid);
  }
}

// dK and dV of block (kv head, sequence b, key block; blockIdx.z = 0 the first, which has the most query tiles),
// summed over the kv head's query heads in order and, for each, over the query tiles from the diagonal down:
// dV = sum P^T dO, dK = scale * sum dS^T Q.
template <int kD>
__global__ void __launch_bounds__(kCtaThreads, 1)
    mma_dkv_kernel(MmaGeometry g, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                   const float* lse, const float* delta, const __nv_bfloat16* dout, __nv_bfloat16* dk,
                   __nv_bfloat16* dv) {
  constexpr int kLd = kD + kPad;
  constexpr int kQueryTile = kDkvQueryTile<kD>;
  constexpr int kQueryTiles = kQueryTile / 8;  // 8-column tiles of S^T
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem);           // [kKeyRows][kLd]
  __nv_bfloat16* vs = ks + kKeyRows * kLd;                              // [kKeyRows][kLd]
  __nv_bfloat16* qs = vs + kKeyRows * kLd;                              // 2 stages of [kQueryTile][kLd]
  __nv_bfloat16* dos = qs + 2 * kQueryTile * kLd;                       // 2 stages of [kQueryTile][kLd]
  float* lse_s = reinterpret_cast<float*>(dos + 2 * kQueryTile * kLd);  // 2 stages of [kQueryTile]
  float* delta_s = lse_s + 2 * kQueryTile;                              // 2 stages of [kQueryTile]

  const std::int64_t kvh = blockIdx.x;
  const std::int64_t b = blockIdx.y;
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.z) * kKeyRows;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int tg = lane & 3;
  const std::int64_t wk0 = j0 + 16 * warp;  // this warp's first key
  // Query tiles from the diagonal down, per query head, and iterations over all of the kv head's query heads
  // (attention_mma_supports checks that they fit an int: 32-bit division is cheaper than 64-bit, and registers are
  // short here).
  const int qblocks = static_cast<int>((g.seq - j0 + kQueryTile - 1) / kQueryTile);
  const int iterations = static_cast<int>(g.group) * qblocks;

  load_tile<kKeyRows, kD>(ks, k + b * g.seq * g.kv_stride + kvh * kD, g.kv_stride, j0, g.seq);
  load_tile<kKeyRows, kD>(vs, v + b * g.seq * g.kv_stride + kvh * kD, g.kv_stride, j0, g.seq);
  cp_async_commit();
  load_dkv_stage<kD>(g, b, kvh, j0, qblocks, 0, 0, q, lse, delta, dout, qs, dos, lse_s, delta_s);
  cp_async_commit();

  float dk_acc[kD / 8][4];
  float dv_acc[kD / 8][4];
  zero(dk_acc);
  zero(dv_acc);

  for (int it = 0; it < iterations; ++it) {
    const int stage = it & 1;
    if (it + 1 < iterations) {
      load_dkv_stage<kD>(g, b, kvh, j0, qblocks, it + 1, stage ^ 1, q, lse, delta, dout, qs, dos, lse_s, delta_s);
      cp_async_commit();
      cp_async_wait<1>();  // K, V and this iteration's stage have landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const std::int64_t i0 = j0 + (it % qblocks) * kQueryTile;
    // A warp whose keys are all past the sequence, or all after the tile's last query, has nothing to add.
    if (wk0 < g.seq && i0 + kQueryTile - 1 >= wk0) {
      const __nv_bfloat16* qt = qs + stage * kQueryTile * kLd;
      const __nv_bfloat16* dot = dos + stage * kQueryTile * kLd;
      const float* lse_t = lse_s + stage * kQueryTile;
      const float* delta_t = delta_s + stage * kQueryTile;
      float s[kQueryTiles][4];
      float dp[kQueryTiles][4];
      zero(s);
      zero(dp);
      // S^T = K Q^T and dP^T = V dO^T: K and V are A operands ([key][d] = [m][k]), Q and dO are stored
      // [query][d] = [n][k].
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        std::uint32_t ka[4];
        std::uint32_t va[4];
        load_a<kLd>(ka, ks, 16 * warp, 16 * kk, lane);
        load_a<kLd>(va, vs, 16 * warp, 16 * kk, lane);
#pragma unroll
        for (int np = 0; np < kQueryTiles / 2; ++np) {
          std::uint32_t qf[2][2];
          std::uint32_t df[2][2];
          load_b_nk<kLd>(qf, qt, 16 * np, 16 * kk, lane);
          load_b_nk<kLd>(df, dot, 16 * np, 16 * kk, lane);
          mma(s[2 * np], ka, qf[0]);
          mma(s[2 * np + 1], ka, qf[1]);
          mma(dp[2 * np], va, df[0]);
          mma(dp[2 * np + 1], va, df[1]);
        }
      }
      // Element e of tile n is (key wk0 + g + 8 (e / 2), query i0 + 8 n + 2t + e % 2). P^T replaces S^T and dS^T
      // replaces dP^T; a query before the key (8 n + e % 2 < first[e / 2], the transpose of causal_limits's test) or
      // past the sequence (8 n + e % 2 >= end) has P = 0.
      int first[2];
      causal_limits(first, i0 - wk0, lane);
      const int end = static_cast<int>(g.seq - i0 < kQueryTile ? g.seq - i0 : kQueryTile) - 2 * tg;
#pragma unroll
      for (int n = 0; n < kQueryTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = 8 * n + 2 * tg + (e & 1);
          float p = exp2f(fmaf(s[n][e], g.scale_log2, -lse_t[col] * kLog2e));
          if (8 * n + (e & 1) < first[e >> 1] || 8 * n + (e & 1) >= end) p = 0.0f;
          s[n][e] = p;
          dp[n][e] = p * (dp[n][e] - delta_t[col]);
        }
      }
      // dV += P^T dO and dK += dS^T Q: the accumulator fragments (rows = keys, columns = queries) are the A
      // operands, dO and Q are stored [query][d] = [k][n].
#pragma unroll
      for (int kk = 0; kk < kQueryTile / 16; ++kk) {
        std::uint32_t pa[4];
        accumulator_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < kD / 16; ++np) {
          std::uint32_t df[2][2];
          load_b_kn<kLd>(df, dot, 16 * kk, 16 * np, lane);
          mma(dv_acc[2 * np], pa, df[0]);
          mma(dv_acc[2 * np + 1], pa, df[1]);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kQueryTile / 16; ++kk) {
        std::uint32_t sa[4];
        accumulator_to_a(sa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < kD / 16; ++np) {
          std::uint32_t qf[2][2];
          load_b_kn<kLd>(qf, qt, 16 * kk, 16 * np, lane);
          mma(dk_acc[2 * np], sa, qf[0]);
          mma(dk_acc[2 * np + 1], sa, qf[1]);
        }
      }
    }
    __syncthreads();
  }

  if (wk0 < g.seq) {
    const std::int64_t at = b * g.seq * g.kv_stride + kvh * kD;
    store_rows<kD>(dk_acc, g.scale, g.scale, dk + at, g.kv_stride, wk0, g.seq, lane);
    store_rows<kD>(dv_acc, 1.0f, 1.0f, dv + at, g.kv_stride, wk0, g.seq, lane);
  }
}

// ---- host side ----------------------------------------------------------------------------------------------------

constexpr std::int64_t kMaxGridZ = 65535;

MmaGeometry make_mma_geometry(const AttentionShape& s) {
  DTRAIN_CHECK(attention_mma_supports(s, nullptr), "attention: shape not supported by the tensor-core kernels");
  DTRAIN_CHECK(s.batch > 0 && s.seq > 0 && s.n_heads > 0, "attention: empty shape given to the tensor-core kernels");
  MmaGeometry g{};
  g.seq = s.seq;
  g.n_heads = s.n_heads;
  g.group = s.n_heads / s.n_kv_heads;
  g.q_stride = s.q_stride;
  g.kv_stride = s.kv_stride;
  g.o_stride = s.n_heads * s.head_dim;
  g.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));  // as attention.cu and the CPU
  g.scale_log2 = g.scale * kLog2e;
  return g;
}

// Allows `kernel` the dynamic shared memory it needs (above 48 KB a kernel must opt in).
template <class Kernel>
void allow_smem(Kernel kernel, int bytes) {
  DTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

void check_aligned(const void* p, const char* name) {
  DTRAIN_CHECK(attention_mma_aligned(p), std::string("attention: ") + name + " is not 16-byte aligned");
}

template <int kD>
void forward_impl(Context& ctx, const AttentionShape& s, const MmaGeometry& g, const bf16* q, const bf16* k,
                  const bf16* v, bf16* o, float* lse) {
  constexpr int kSmem = forward_smem_bytes<kD>();
  allow_smem(mma_forward_kernel<kD>, kSmem);
  const dim3 grid(static_cast<unsigned>(s.n_heads), static_cast<unsigned>(s.batch),
                  static_cast<unsigned>((s.seq + kQueryRows - 1) / kQueryRows));
  mma_forward_kernel<kD>
      <<<grid, kCtaThreads, kSmem, stream_of(ctx)>>>(g, as_device(q), as_device(k), as_device(v), as_device(o), lse);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "attention_forward (tensor cores)");
}

template <int kD>
void backward_impl(Context& ctx, const AttentionShape& s, const MmaGeometry& g, const bf16* q, const bf16* k,
                   const bf16* v, const bf16* o, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv) {
  const std::int64_t rows = s.batch * s.n_heads * s.seq;
  DeviceBuffer<float> delta = allocate<float>(ctx, static_cast<std::size_t>(rows));
  constexpr std::int64_t kRowsPerCta = kCtaThreads / (kD / 8);
  mma_delta_kernel<kD><<<checked_grid((rows + kRowsPerCta - 1) / kRowsPerCta), kCtaThreads, 0, stream_of(ctx)>>>(
      g, rows, as_device(o), as_device(dout), delta.data());
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "attention_backward (tensor cores, delta)");

  constexpr int kDqSmem = dq_smem_bytes<kD>();
  allow_smem(mma_dq_kernel<kD>, kDqSmem);
  const dim3 dq_grid(static_cast<unsigned>(s.n_heads), static_cast<unsigned>(s.batch),
                     static_cast<unsigned>((s.seq + kQueryRows - 1) / kQueryRows));
  mma_dq_kernel<kD><<<dq_grid, kCtaThreads, kDqSmem, stream_of(ctx)>>>(g, as_device(q), as_device(k), as_device(v), lse,
                                                                       delta.data(), as_device(dout), as_device(dq));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "attention_backward (tensor cores, dq)");

  constexpr int kDkvSmem = dkv_smem_bytes<kD>();
  allow_smem(mma_dkv_kernel<kD>, kDkvSmem);
  const dim3 dkv_grid(static_cast<unsigned>(s.n_kv_heads), static_cast<unsigned>(s.batch),
                      static_cast<unsigned>((s.seq + kKeyRows - 1) / kKeyRows));
  mma_dkv_kernel<kD><<<dkv_grid, kCtaThreads, kDkvSmem, stream_of(ctx)>>>(
      g, as_device(q), as_device(k), as_device(v), lse, delta.data(), as_device(dout), as_device(dk), as_device(dv));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "attention_backward (tensor cores, dk, dv)");
  // `delta` returns to the pool here; stream ordering keeps it intact until the kernels have run (memory.h).
}

}  // namespace

bool attention_mma_supports(const AttentionShape& shape, const AttentionDropout* dropout) {
  if (shape.head_dim != 64 && shape.head_dim != 128) return false;
  if (dropout != nullptr && dropout->p != 0.0f) return false;
  if (shape.q_stride % 8 != 0 || shape.kv_stride % 8 != 0 || shape.n_kv_heads <= 0) return false;
  // The grid's z dimension counts blocks of 128 rows; the dK/dV kernel counts its iterations (query heads of a kv
  // head times query tiles of at least 32 rows) in an int.
  const std::int64_t group = shape.n_heads / shape.n_kv_heads;
  return shape.seq <= kMaxGridZ * kKeyTile && group * ((shape.seq + 31) / 32) <= std::numeric_limits<int>::max();
}

bool attention_mma_aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

void attention_mma_forward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                           bf16* o, float* lse) {
  const MmaGeometry g = make_mma_geometry(shape);
  check_aligned(q, "q");
  check_aligned(k, "k");
  check_aligned(v, "v");
  check_aligned(o, "o");
  if (shape.head_dim == 64) return forward_impl<64>(ctx, shape, g, q, k, v, o, lse);
  return forward_impl<128>(ctx, shape, g, q, k, v, o, lse);
}

void attention_mma_backward(Context& ctx, const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                            const bf16* o, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv) {
  const MmaGeometry g = make_mma_geometry(shape);
  check_aligned(q, "q");
  check_aligned(k, "k");
  check_aligned(v, "v");
  check_aligned(o, "o");
  check_aligned(dout, "dout");
  check_aligned(dq, "dq");
  check_aligned(dk, "dk");
  check_aligned(dv, "dv");
  if (shape.head_dim == 64) return backward_impl<64>(ctx, shape, g, q, k, v, o, lse, dout, dq, dk, dv);
  return backward_impl<128>(ctx, shape, g, q, k, v, o, lse, dout, dq, dk, dv);
}

}  // namespace dtrain::kernels::cuda::detail
