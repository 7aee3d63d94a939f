// Token and position embeddings. The token embedding's backward is deterministic without float atomics: each id's
// first token owns the table row and adds all its tokens' gradients in token order (embedding.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/embedding.h"

namespace dtrain::kernels::cuda {

namespace {

using detail::as_device;
using detail::global_thread;
using detail::grid_threads;
using detail::kThreads;
using detail::stream_of;

__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids,
                             const __nv_bfloat16* table, std::int64_t begin, std::int64_t end, __nv_bfloat16* out) {
  const std::int64_t n = tokens * hidden;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const std::int64_t t = i / hidden;
    const std::int64_t j = i % hidden;
    const std::int64_t id = ids[t];
    out[i] = (id >= begin && id < end) ? table[(id - begin) * hidden + j] : __float2bfloat16(0.0f);
  }
}

// owner[id - begin] = the first token with that id (integer atomicMin: the result is the minimum whatever the order).
__global__ void __launch_bounds__(kThreads) embedding_owner_kernel(std::int64_t tokens, const std::int32_t* ids,
                                                                   std::int64_t begin, std::int64_t end, int* owner) {
  for (std::int64_t t = global_thread(); t < tokens; t += grid_threads()) {
    const std::int64_t id = ids[t];
    if (id >= begin && id < end) atomicMin(owner + (id - begin), static_cast<int>(t));
  }
}

constexpr int kColumnsPerThread = 8;
constexpr int kColumnsPerBlock = kThreads * kColumnsPerThread;

// Block (t, column slab): if token t is its id's first occurrence, row[id] += dout[t'] for every token t' >= t with the
// same id, t' in increasing order, over the slab's columns. Ids are scanned kThreads at a time; each warp's matches
// are a ballot mask, walked from the lowest bit, so the tokens are added in order.
__global__ void __launch_bounds__(kThreads)
    embedding_backward_kernel(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids,
                              const __nv_bfloat16* dout, std::int64_t begin, std::int64_t end, const int* owner,
                              float* dtable) {
  __shared__ unsigned match_masks[kThreads / 32];
  const std::int64_t t = blockIdx.x;
  const std::int64_t id = ids[t];
  if (id < begin || id >= end || owner[id - begin] != t) return;  // uniform over the block
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.y) * kColumnsPerBlock + threadIdx.x;
  float* row = dtable + (id - begin) * hidden;
  float acc[kColumnsPerThread];
#pragma unroll
  for (int k = 0; k < kColumnsPerThread; ++k) {
    const std::int64_t c = col0 + static_cast<std::int64_t>(k) * kThreads;
    acc[k] = c < hidden ? row[c] : 0.0f;
  }
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  for (std::int64_t base = t; base < tokens; base += kThreads) {
    const std::int64_t u = base + threadIdx.x;
    const bool match = u < tokens && ids[u] == id;
    const unsigned mask = __ballot_sync(0xffffffffu, match);
    if (lane == 0) match_masks[warp] = mask;
    __syncthreads();
    for (int w = 0; w < kThreads / 32; ++w) {
      unsigned m = match_masks[w];
      while (m != 0u) {
        const int bit = __ffs(static_cast<int>(m)) - 1;
        m &= m - 1u;
        const __nv_bfloat16* g = dout + (base + w * 32 + bit) * hidden;
#pragma unroll
        for (int k = 0; k < kColumnsPerThread; ++k) {
          const std::int64_t c = col0 + static_cast<std::int64_t>(k) * kThreads;
          if (c < hidden) acc[k] += __bfloat162float(g[c]);
        }
      }
    }
    __syncthreads();  // everyone has read match_masks before the next round overwrites it
  }
#pragma unroll
  for (int k = 0; k < kColumnsPerThread; ++k) {
    const std::int64_t c = col0 + static_cast<std::int64_t>(k) * kThreads;
    if (c < hidden) row[c] = acc[k];
  }
}

__global__ void __launch_bounds__(kThreads)
    position_forward_kernel(std::int64_t rows, std::int64_t seq, std::int64_t hidden, const __nv_bfloat16* pos,
                            __nv_bfloat16* x) {
  const std::int64_t n = rows * hidden;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const std::int64_t r = i / hidden;
    const std::int64_t j = i % hidden;
    x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(pos[(r % seq) * hidden + j]));
  }
}

// dpos[s, j] += dx[0, s, j] + dx[1, s, j] + ... added one sequence at a time in order, as the CPU backend.
__global__ void __launch_bounds__(kThreads)
    position_backward_kernel(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const __nv_bfloat16* dx,
                             float* dpos) {
  const std::int64_t n = seq * hidden;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    float acc = dpos[i];
    for (std::int64_t b = 0; b < batch; ++b) acc += __bfloat162float(dx[b * n + i]);
    dpos[i] = acc;
  }
}

void check_dims(std::int64_t a, std::int64_t b, const char* name) {
  DTRAIN_CHECK(a >= 0 && b >= 0, std::string(name) + ": negative dimension");
}

}  // namespace

void embedding_forward(Context& ctx, std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids,
                       const bf16* table, VocabShard shard, bf16* out) {
  check_dims(tokens, hidden, "embedding_forward");
  if (tokens == 0 || hidden == 0) return;
  embedding_forward_kernel<<<detail::grid_for(tokens * hidden), kThreads, 0, stream_of(ctx)>>>(
      tokens, hidden, ids, as_device(table), shard.begin, shard.end, as_device(out));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "embedding_forward");
}

void embedding_backward(Context& ctx, std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids,
                        const bf16* dout, VocabShard shard, float* dtable) {
  check_dims(tokens, hidden, "embedding_backward");
  DTRAIN_CHECK(shard.size() >= 0, "embedding_backward: empty shard range");
  if (tokens == 0 || hidden == 0 || shard.size() == 0) return;
  DTRAIN_CHECK(tokens < 0x7f7f7f7f, "embedding_backward: too many tokens for the int owner table");
  const std::int64_t slabs = (hidden + kColumnsPerBlock - 1) / kColumnsPerBlock;
  DTRAIN_CHECK(slabs <= 65535, "embedding_backward: hidden too large");
  DeviceBuffer<int> owner = allocate<int>(ctx, static_cast<std::size_t>(shard.size()));
  // 0x7f bytes: 0x7f7f7f7f, larger than every token index (checked above), the "no token yet" value.
  memset_device(ctx, owner.data(), 0x7f, owner.bytes());
  embedding_owner_kernel<<<detail::grid_for(tokens), kThreads, 0, stream_of(ctx)>>>(tokens, ids, shard.begin, shard.end,
                                                                                    owner.data());
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "embedding_backward (owners)");
  const dim3 grid(detail::checked_grid(tokens), static_cast<unsigned>(slabs));
  embedding_backward_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(tokens, hidden, ids, as_device(dout), shard.begin,
                                                                   shard.end, owner.data(), dtable);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "embedding_backward");
}

void position_embedding_forward(Context& ctx, std::int64_t batch, std::int64_t seq, std::int64_t hidden,
                                const bf16* pos, bf16* x) {
  check_dims(batch * seq, hidden, "position_embedding_forward");
  if (batch == 0 || seq == 0 || hidden == 0) return;
  position_forward_kernel<<<detail::grid_for(batch * seq * hidden), kThreads, 0, stream_of(ctx)>>>(
      batch * seq, seq, hidden, as_device(pos), as_device(x));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "position_embedding_forward");
}

void position_embedding_backward(Context& ctx, std::int64_t batch, std::int64_t seq, std::int64_t hidden,
                                 const bf16* dx, float* dpos) {
  check_dims(batch * seq, hidden, "position_embedding_backward");
  if (batch == 0 || seq == 0 || hidden == 0) return;
  position_backward_kernel<<<detail::grid_for(seq * hidden), kThreads, 0, stream_of(ctx)>>>(batch, seq, hidden,
                                                                                            as_device(dx), dpos);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "position_embedding_backward");
}

}  // namespace dtrain::kernels::cuda
