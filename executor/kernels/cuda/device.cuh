// Internal: device-side helpers shared by the CUDA backend's kernels (.cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.h"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/dropout.h"

namespace dtrain::kernels::cuda::detail {

// ---- bf16 storage <-> device type ---------------------------------------------------------------------------------

inline const __nv_bfloat16* as_device(const bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
inline __nv_bfloat16* as_device(bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
inline const float* as_device(const float* p) { return p; }
inline float* as_device(float* p) { return p; }

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
// Stores v rounded to the element type (bf16: nearest, ties to even).
__device__ __forceinline__ void store_as(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void store_as(float* p, float v) { *p = v; }

// ---- 16-byte accesses ----------------------------------------------------------------------------------------------
// 8 elements as fp32 from and to 16-byte-aligned memory (one uint4 of bf16, two float4 of fp32); the bf16 stores round
// to nearest, ties to even, as __float2bfloat16.
inline constexpr std::int64_t kVec = 8;
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[kVec]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(pairs[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const float* p, float (&v)[kVec]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[kVec]) {
  uint4 raw;
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) pairs[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}
__device__ __forceinline__ void store8(float* p, const float (&v)[kVec]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// Over a row of n elements by one block: f8(j) for the groups of 8 starting at j (where `vec`: every array the
// caller reads or writes there 16-byte aligned at j), then f1(j) for each element left.
template <class F8, class F1>
__device__ __forceinline__ void over_row(std::int64_t n, bool vec, F8&& f8, F1&& f1) {
  std::int64_t done = 0;
  if (vec) {
    const std::int64_t chunks = n / kVec;
    for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) f8(c * kVec);
    done = chunks * kVec;
  }
  for (std::int64_t j = done + threadIdx.x; j < n; j += blockDim.x) f1(j);
}

// ---- launch geometry ----------------------------------------------------------------------------------------------

inline constexpr int kThreads = 256;  // threads per block of the elementwise and row kernels

// Blocks for a grid-stride loop over n items (at least 1; capped: each thread then loops).
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  constexpr std::int64_t kMaxBlocks = std::int64_t{1} << 16;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_threads() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// A 1-D grid of `blocks` blocks (one per work item); throws if it exceeds CUDA's limit.
inline unsigned checked_grid(std::int64_t blocks) {
  DTRAIN_CHECK(blocks >= 0 && blocks <= 0x7fffffff, "cuda: grid too large for one launch");
  return static_cast<unsigned>(blocks);
}

// ---- reductions ---------------------------------------------------------------------------------------------------
// Butterfly (xor) shuffles: every lane combines the same two values in the same way at every step (a + b and b + a,
// max(a, b) and max(b, a) are the same bits), so all lanes end with the identical result, and the order of the
// combination is fixed: reductions are bitwise repeatable.

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduction over the whole block, result in every thread. blockDim.x must be a multiple of 32; every thread of the
// block must call it (it synchronises). `shared` holds 32 values.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* shared) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int warps = static_cast<int>(blockDim.x >> 5);
  v = warp_reduce(v, op);
  __syncthreads();  // an earlier call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : identity;
  return warp_reduce(v, op);
}

// ---- dropout masks: the Philox contract of dropout.h --------------------------------------------------------------

__device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, uint2 key) {
  constexpr unsigned kM0 = 0xD2511F53u;
  constexpr unsigned kM1 = 0xCD9E8D57u;
  constexpr unsigned kW0 = 0x9E3779B9u;
  constexpr unsigned kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.x += kW0;
      key.y += kW1;
    }
    const unsigned hi0 = __umulhi(kM0, ctr.x);
    const unsigned lo0 = kM0 * ctr.x;
    const unsigned hi1 = __umulhi(kM1, ctr.z);
    const unsigned lo1 = kM1 * ctr.z;
    ctr = make_uint4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
  }
  return ctr;
}

// A DropoutKey and probability prepared for the device.
struct DeviceDropout {
  uint2 key;
  unsigned c2;  // step
  unsigned c3;  // layer << 4 | site
  float p;
  float keep_scale;  // 1 / (1 - p), computed in float as the CPU backend does
};

inline DeviceDropout make_device_dropout(const DropoutKey& key, float p) {
  DeviceDropout d{};
  d.key = make_uint2(static_cast<unsigned>(key.seed), static_cast<unsigned>(key.seed >> 32));
  d.c2 = static_cast<unsigned>(key.step);
  d.c3 = (key.layer << 4) | static_cast<unsigned>(key.site);
  d.p = p;
  d.keep_scale = 1.0f / (1.0f - p);
  return d;
}

// 0 or 1 / (1 - p) for global element index e: word e % 4 of philox((e / 4, step, layer << 4 | site), seed).
__device__ __forceinline__ float dropout_scale(const DeviceDropout& d, std::uint64_t e) {
  const std::uint64_t q = e >> 2;
  const uint4 r =
      philox4x32_10(make_uint4(static_cast<unsigned>(q), static_cast<unsigned>(q >> 32), d.c2, d.c3), d.key);
  const unsigned w = static_cast<unsigned>(e & 3u);
  const unsigned bits = w == 0 ? r.x : (w == 1 ? r.y : (w == 2 ? r.z : r.w));
  const float u = static_cast<float>(bits >> 8) * 0x1.0p-24f;
  return u >= d.p ? d.keep_scale : 0.0f;
}

// ---- deterministic column sums ------------------------------------------------------------------------------------
// out_o[c] += sum_r f_o(r, c) for o < kOutputs over a [rows, cols] domain, without atomics: pass 1 sums fixed chunks
// of kColumnChunkRows rows (block: 32 columns x 8 row lanes; lane l takes rows l, l + 8, ... of the chunk in order,
// then the 8 lanes are added in order); pass 2 adds the chunks in order per column. The order depends on rows and
// cols only. F is a functor: __device__ void operator()(int64 r, int64 c, float (&v)[kOutputs]) const.

inline constexpr int kColumnChunkRows = 64;
inline constexpr int kColumnTile = 32;
inline constexpr int kColumnLanes = 8;

template <int kOutputs, class F>
__global__ void __launch_bounds__(kColumnTile* kColumnLanes)
    column_partial_kernel(std::int64_t rows, std::int64_t cols, std::int64_t col_tiles, F f, float* partial) {
  __shared__ float sums[kOutputs][kColumnLanes][kColumnTile + 1];
  const int tx = static_cast<int>(threadIdx.x % kColumnTile);
  const int ty = static_cast<int>(threadIdx.x / kColumnTile);
  const std::int64_t chunk = blockIdx.x / col_tiles;
  const std::int64_t col = (blockIdx.x % col_tiles) * kColumnTile + tx;
  const std::int64_t chunks = (rows + kColumnChunkRows - 1) / kColumnChunkRows;
  const std::int64_t r0 = chunk * kColumnChunkRows;
  const std::int64_t r1 = r0 + kColumnChunkRows < rows ? r0 + kColumnChunkRows : rows;
  float acc[kOutputs];
#pragma unroll
  for (int o = 0; o < kOutputs; ++o) acc[o] = 0.0f;
  if (col < cols) {
    for (std::int64_t r = r0 + ty; r < r1; r += kColumnLanes) {
      float v[kOutputs];
      f(r, col, v);
#pragma unroll
      for (int o = 0; o < kOutputs; ++o) acc[o] += v[o];
    }
  }
#pragma unroll
  for (int o = 0; o < kOutputs; ++o) sums[o][ty][tx] = acc[o];
  __syncthreads();
  if (ty == 0 && col < cols) {
#pragma unroll
    for (int o = 0; o < kOutputs; ++o) {
      float s = 0.0f;
#pragma unroll
      for (int l = 0; l < kColumnLanes; ++l) s += sums[o][l][tx];
      partial[(o * chunks + chunk) * cols + col] = s;
    }
  }
}

template <int kOutputs>
__global__ void column_finish_kernel(std::int64_t chunks, std::int64_t cols, const float* partial, float* out0,
                                     float* out1) {
  const std::int64_t col = global_thread();
  if (col >= cols) return;
#pragma unroll
  for (int o = 0; o < kOutputs; ++o) {
    float* out = o == 0 ? out0 : out1;
    if (out == nullptr) continue;
    float s = 0.0f;
    for (std::int64_t c = 0; c < chunks; ++c) s += partial[(o * chunks + c) * cols + col];
    out[col] += s;
  }
}

// out0[c] += sum_r f_0(r, c) and (kOutputs == 2) out1[c] += sum_r f_1(r, c); out1 may be nullptr.
template <int kOutputs, class F>
void column_sums(Context& ctx, std::int64_t rows, std::int64_t cols, const F& f, float* out0, float* out1,
                 const char* name) {
  static_assert(kOutputs == 1 || kOutputs == 2, "one or two column sums per pass");
  if (rows <= 0 || cols <= 0) return;
  const std::int64_t chunks = (rows + kColumnChunkRows - 1) / kColumnChunkRows;
  const std::int64_t col_tiles = (cols + kColumnTile - 1) / kColumnTile;
  DeviceBuffer<float> partial = allocate<float>(ctx, static_cast<std::size_t>(kOutputs * chunks * cols));
  column_partial_kernel<kOutputs, F>
      <<<checked_grid(chunks * col_tiles), kColumnTile * kColumnLanes, 0, stream_of(ctx)>>>(rows, cols, col_tiles, f,
                                                                                            partial.data());
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, name);
  column_finish_kernel<kOutputs><<<checked_grid((cols + kThreads - 1) / kThreads), kThreads, 0, stream_of(ctx)>>>(
      chunks, cols, partial.data(), out0, out1);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, name);
  // `partial` goes back to the pool here: stream-ordered reuse (memory.h) keeps it intact until the kernels ran.
}

}  // namespace dtrain::kernels::cuda::detail
