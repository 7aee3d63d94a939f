// Multi-tensor AdamW, gradient norm and scale. Buffer lists travel as __grid_constant__ kernel parameters (up to
// kMaxTensors per launch); each element's update is adamw_update (dtrain/kernels/adamw_update.h), the CPU backend's
// own definition, whose device spelling rounds every operation on its own (no FMA): the CPU's bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/check.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"
#include "dtrain/kernels/adamw_update.h"
#include "dtrain/kernels/cuda/optimizer.h"

namespace dtrain::kernels::cuda {

namespace {

using detail::block_reduce;
using detail::global_thread;
using detail::grid_threads;
using detail::kThreads;
using detail::stream_of;
using detail::SumOp;

constexpr int kMaxTensors = 32;
// Elements per partial sum of the gradient norm, as on the CPU: a constant, so the order never depends on the grid.
constexpr std::int64_t kNormBlock = 4096;

struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  std::int64_t numel;
  int decay;
};

struct AdamWList {
  AdamWTensor tensors[kMaxTensors];
  int count;
};

__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ AdamWList list, AdamWScalars c) {
  for (int k = 0; k < list.count; ++k) {
    const AdamWTensor& t = list.tensors[k];
    for (std::int64_t i = global_thread(); i < t.numel; i += grid_threads()) {
      const AdamWElement e = adamw_update(c, t.decay != 0, t.param[i], t.grad[i], t.m[i], t.v[i]);
      t.m[i] = e.m;
      t.v[i] = e.v;
      t.param[i] = e.param;
    }
  }
}

struct NormTensor {
  const float* grad;
  std::int64_t numel;
  std::int64_t first_block;  // index of this tensor's first kNormBlock-element block among all blocks of the call
};

struct NormList {
  NormTensor tensors[kMaxTensors];
  int count;
};

// One thread block per kNormBlock-element block of any tensor in the list: partial[first_block + b] = sum of squares,
// each square exact in float64 (a float's square has at most 48 significant bits), summed per thread in a fixed
// stride and then by a fixed-order block reduction.
__global__ void __launch_bounds__(kThreads)
    norm_partial_kernel(const __grid_constant__ NormList list, std::int64_t list_first_block, double* partial) {
  __shared__ double shared[32];
  const std::int64_t block = list_first_block + blockIdx.x;
  int k = 0;
  while (k + 1 < list.count && list.tensors[k + 1].first_block <= block) ++k;
  const NormTensor& t = list.tensors[k];
  const std::int64_t first = (block - t.first_block) * kNormBlock;
  const std::int64_t last = first + kNormBlock < t.numel ? first + kNormBlock : t.numel;
  double s = 0.0;
  for (std::int64_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    const double x = t.grad[i];
    s += x * x;
  }
  s = block_reduce(s, SumOp{}, 0.0, shared);
  if (threadIdx.x == 0) partial[block] = s;
}

// *result = sum of partial[0, n) by one block: thread j sums j, j + blockDim, ... in order, then a fixed tree.
__global__ void __launch_bounds__(kThreads) norm_final_kernel(std::int64_t n, const double* partial, double* result) {
  __shared__ double shared[32];
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_reduce(s, SumOp{}, 0.0, shared);
  if (threadIdx.x == 0) *result = s;
}

__global__ void __launch_bounds__(kThreads) scale_kernel(std::int64_t n, float factor, float* x) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) x[i] = __fmul_rn(x[i], factor);
}

}  // namespace

void adamw_step(Context& ctx, const AdamWConfig& cfg, const AdamWBuffer* buffers, std::int64_t count) {
  DTRAIN_CHECK(cfg.step >= 1, "adamw_step: step is 1-based");
  DTRAIN_CHECK(count >= 0, "adamw_step: negative buffer count");
  const AdamWScalars c = adamw_scalars(cfg);  // the CPU backend's scalars (adamw_update.h)
  for (std::int64_t first = 0; first < count; first += kMaxTensors) {
    AdamWList list{};
    std::int64_t largest = 0;
    for (std::int64_t b = first; b < std::min(count, first + kMaxTensors); ++b) {
      const AdamWBuffer& buf = buffers[b];
      DTRAIN_CHECK(buf.numel >= 0, "adamw_step: negative buffer size");
      if (buf.numel == 0) continue;
      list.tensors[list.count++] = AdamWTensor{buf.param, buf.grad, buf.m, buf.v, buf.numel, buf.decay ? 1 : 0};
      largest = std::max(largest, buf.numel);
    }
    if (list.count == 0) continue;
    adamw_kernel<<<detail::grid_for(largest), kThreads, 0, stream_of(ctx)>>>(list, c);
    DTRAIN_CUDA_CHECK_LAUNCH(ctx, "adamw_step");
  }
}

void grad_norm_squared(Context& ctx, const GradBuffer* buffers, std::int64_t count, double* result) {
  DTRAIN_CHECK(count >= 0, "grad_norm_squared: negative buffer count");
  std::int64_t total_blocks = 0;
  for (std::int64_t b = 0; b < count; ++b) {
    DTRAIN_CHECK(buffers[b].numel >= 0, "grad_norm_squared: negative buffer size");
    total_blocks += (buffers[b].numel + kNormBlock - 1) / kNormBlock;
  }
  DeviceBuffer<double> partial =
      allocate<double>(ctx, static_cast<std::size_t>(std::max<std::int64_t>(total_blocks, 1)));
  std::int64_t next_block = 0;
  std::int64_t b = 0;
  while (b < count) {
    NormList list{};
    const std::int64_t list_first_block = next_block;
    while (b < count && list.count < kMaxTensors) {
      const GradBuffer& buf = buffers[b++];
      if (buf.numel == 0) continue;
      list.tensors[list.count++] = NormTensor{buf.grad, buf.numel, next_block};
      next_block += (buf.numel + kNormBlock - 1) / kNormBlock;
    }
    if (list.count == 0) continue;
    norm_partial_kernel<<<detail::checked_grid(next_block - list_first_block), kThreads, 0, stream_of(ctx)>>>(
        list, list_first_block, partial.data());
    DTRAIN_CUDA_CHECK_LAUNCH(ctx, "grad_norm_squared (blocks)");
  }
  // With no elements the final kernel writes 0 (it reads no partial sum).
  norm_final_kernel<<<1, kThreads, 0, stream_of(ctx)>>>(next_block, partial.data(), result);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "grad_norm_squared");
}

void scale(Context& ctx, std::int64_t n, float factor, float* x) {
  DTRAIN_CHECK(n >= 0, "scale: negative size");
  if (n == 0) return;
  scale_kernel<<<detail::grid_for(n), kThreads, 0, stream_of(ctx)>>>(n, factor, x);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "scale");
}

}  // namespace dtrain::kernels::cuda
