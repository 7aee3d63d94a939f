// Mixture-of-experts kernels (dtrain/kernels/cuda/moe.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/moe.h"
#include "dtrain/kernels/moe_route.h"

namespace dtrain::kernels::cuda {

namespace {

using detail::as_device;
using detail::block_reduce;
using detail::global_thread;
using detail::grid_for;
using detail::grid_threads;
using detail::kThreads;
using detail::store_as;
using detail::stream_of;
using detail::SumOp;
using detail::to_float;

// One thread per token (dtrain/kernels/moe_route.h).
struct Bf16Row {
  const __nv_bfloat16* x;
  __host__ __device__ float operator[](std::int64_t e) const { return __bfloat162float(x[e]); }
};

struct StoreBf16 {
  __nv_bfloat16* row;
  __host__ __device__ void operator()(std::int64_t e, float v) const { row[e] = __float2bfloat16(v); }
};

__global__ void __launch_bounds__(kThreads)
    route_kernel(MoeRouteShape s, const __nv_bfloat16* logits, float* probs, std::int32_t* expert, float* gate) {
  for (std::int64_t t = global_thread(); t < s.tokens; t += grid_threads()) {
    route_token(s.experts, s.top_k, s.normalize, Bf16Row{logits + t * s.experts}, probs + t * s.experts,
                expert + t * s.top_k, gate + t * s.top_k);
  }
}

__global__ void __launch_bounds__(kThreads)
    route_backward_kernel(MoeRouteShape s, const float* probs, const std::int32_t* expert, const float* dgate,
                          const float* aux_grad, std::int64_t seq_len, __nv_bfloat16* dlogits) {
  const std::int64_t E = s.experts, K = s.top_k;
  for (std::int64_t t = global_thread(); t < s.tokens; t += grid_threads()) {
    route_token_backward(E, K, s.normalize, probs + t * E, expert + t * K, dgate + t * K,
                         aux_grad != nullptr ? aux_grad + (t / seq_len) * E : nullptr, StoreBf16{dlogits + t * E});
  }
}

__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(std::int64_t n, std::int64_t cols, const __nv_bfloat16* src, const std::int32_t* rows,
                       __nv_bfloat16* dst) {
  for (std::int64_t i = global_thread(); i < n * cols; i += grid_threads()) {
    const std::int64_t r = i / cols, c = i % cols;
    dst[i] = src[static_cast<std::int64_t>(rows[r]) * cols + c];
  }
}

__global__ void __launch_bounds__(kThreads)
    unpermute_kernel(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const __nv_bfloat16* src,
                     const std::int32_t* slot, const float* weight, bool accumulate, __nv_bfloat16* out) {
  for (std::int64_t i = global_thread(); i < tokens * cols; i += grid_threads()) {
    const std::int64_t t = i / cols, c = i % cols;
    float acc = accumulate ? to_float(out[i]) : 0.0f;
    for (std::int64_t j = 0; j < top_k; ++j) {
      const std::int32_t row = slot[t * top_k + j];
      if (row < 0) continue;
      const float w = weight != nullptr ? weight[t * top_k + j] : 1.0f;
      acc += w * to_float(src[static_cast<std::int64_t>(row) * cols + c]);
    }
    store_as(out + i, acc);
  }
}

__global__ void __launch_bounds__(kThreads)
    unpermute_grad_rows_kernel(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const __nv_bfloat16* dout,
                               const std::int32_t* slot, const float* gate, __nv_bfloat16* dsrc) {
  for (std::int64_t i = global_thread(); i < tokens * top_k * cols; i += grid_threads()) {
    const std::int64_t a = i / cols, c = i % cols, t = a / top_k;
    const std::int32_t row = slot[a];
    if (row < 0) continue;
    store_as(dsrc + static_cast<std::int64_t>(row) * cols + c, gate[a] * to_float(dout[t * cols + c]));
  }
}

// One block per assignment (t, j): dgate = dot(dout[t], src[slot]).
__global__ void __launch_bounds__(kThreads)
    unpermute_grad_gate_kernel(std::int64_t top_k, std::int64_t cols, const __nv_bfloat16* dout,
                               const __nv_bfloat16* src, const std::int32_t* slot, float* dgate) {
  __shared__ float shared[32];
  const std::int64_t a = blockIdx.x, t = a / top_k;
  const std::int32_t row = slot[a];
  float acc = 0.0f;
  if (row >= 0) {
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      acc += to_float(dout[t * cols + c]) * to_float(src[static_cast<std::int64_t>(row) * cols + c]);
    }
  }
  acc = block_reduce(acc, SumOp{}, 0.0f, shared);
  if (threadIdx.x == 0) dgate[a] = acc;
}

__global__ void __launch_bounds__(kThreads) sigmoid_gate_kernel(std::int64_t tokens, const __nv_bfloat16* z, float* g) {
  for (std::int64_t t = global_thread(); t < tokens; t += grid_threads()) g[t] = 1.0f / (1.0f + expf(-to_float(z[t])));
}

__global__ void __launch_bounds__(kThreads)
    sigmoid_gate_backward_kernel(std::int64_t tokens, const float* g, const float* dg, __nv_bfloat16* dz) {
  for (std::int64_t t = global_thread(); t < tokens; t += grid_threads())
    store_as(dz + t, g[t] * (1.0f - g[t]) * dg[t]);
}

void check_shape(const MoeRouteShape& s, const char* name) {
  DTRAIN_CHECK(s.tokens >= 0 && s.experts > 0 && s.top_k > 0 && s.top_k <= s.experts,
               std::string(name) + ": bad router shape");
}

}  // namespace

void moe_route(Context& ctx, const MoeRouteShape& s, const bf16* logits, float* probs, std::int32_t* expert,
               float* gate) {
  check_shape(s, "moe_route");
  if (s.tokens == 0) return;
  route_kernel<<<grid_for(s.tokens), kThreads, 0, stream_of(ctx)>>>(s, as_device(logits), probs, expert, gate);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "moe_route");
}

void moe_route_backward(Context& ctx, const MoeRouteShape& s, const float* probs, const std::int32_t* expert,
                        const float* dgate, const float* aux_grad, std::int64_t seq_len, bf16* dlogits) {
  check_shape(s, "moe_route_backward");
  if (s.tokens == 0) return;
  DTRAIN_CHECK(seq_len > 0, "moe_route_backward: seq_len must be positive");
  route_backward_kernel<<<grid_for(s.tokens), kThreads, 0, stream_of(ctx)>>>(s, probs, expert, dgate, aux_grad, seq_len,
                                                                             as_device(dlogits));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "moe_route_backward");
}

void moe_gather_rows(Context& ctx, std::int64_t n, std::int64_t cols, const bf16* src, const std::int32_t* rows,
                     bf16* dst) {
  if (n * cols == 0) return;
  gather_rows_kernel<<<grid_for(n * cols), kThreads, 0, stream_of(ctx)>>>(n, cols, as_device(src), rows,
                                                                          as_device(dst));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "moe_gather_rows");
}

void moe_unpermute(Context& ctx, std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const bf16* src,
                   const std::int32_t* slot, const float* weight, bool accumulate, bf16* out) {
  if (tokens * cols == 0) return;
  unpermute_kernel<<<grid_for(tokens * cols), kThreads, 0, stream_of(ctx)>>>(tokens, top_k, cols, as_device(src), slot,
                                                                             weight, accumulate, as_device(out));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "moe_unpermute");
}

void moe_unpermute_backward(Context& ctx, std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const bf16* dout,
                            const bf16* src, const std::int32_t* slot, const float* gate, bf16* dsrc, float* dgate) {
  if (tokens * top_k == 0) return;
  if (cols > 0) {
    unpermute_grad_rows_kernel<<<grid_for(tokens * top_k * cols), kThreads, 0, stream_of(ctx)>>>(
        tokens, top_k, cols, as_device(dout), slot, gate, as_device(dsrc));
    DTRAIN_CUDA_CHECK_LAUNCH(ctx, "moe_unpermute_backward");
  }
  unpermute_grad_gate_kernel<<<detail::checked_grid(tokens * top_k), kThreads, 0, stream_of(ctx)>>>(
      top_k, cols, as_device(dout), as_device(src), slot, dgate);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "moe_unpermute_backward");
}

void moe_sigmoid_gate(Context& ctx, std::int64_t tokens, const bf16* z, float* g) {
  if (tokens == 0) return;
  sigmoid_gate_kernel<<<grid_for(tokens), kThreads, 0, stream_of(ctx)>>>(tokens, as_device(z), g);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "moe_sigmoid_gate");
}

void moe_sigmoid_gate_backward(Context& ctx, std::int64_t tokens, const float* g, const float* dg, bf16* dz) {
  if (tokens == 0) return;
  sigmoid_gate_backward_kernel<<<grid_for(tokens), kThreads, 0, stream_of(ctx)>>>(tokens, g, dg, as_device(dz));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "moe_sigmoid_gate_backward");
}

}  // namespace dtrain::kernels::cuda
