// Vocab-parallel cross entropy phases: one block per token row, fixed-order block reductions; the mean loss in
// float64 by one block.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/device.cuh"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/cross_entropy.h"

namespace dtrain::kernels::cuda {

namespace {

using detail::as_device;
using detail::block_reduce;
using detail::kThreads;
using detail::MaxOp;
using detail::stream_of;
using detail::SumOp;
using detail::to_float;

constexpr float kNegInf = -__builtin_huge_valf();

// f(j, x) for each element j < n of a row, in 16-byte loads of 8 where the row allows it (`vec`: the row 16-byte
// aligned), then one by one for the rest. A row of 128256 bf16 logits read 2 bytes a thread ran at 1.3 TB/s on an
// H100 (bench/results/gpu-speed.md).
template <class T, class F>
__device__ __forceinline__ void for_each_in_row(const T* row, std::int64_t n, bool vec, F&& f) {
  detail::over_row(
      n, vec,
      [&](std::int64_t j0) {
        float v[detail::kVec];
        detail::load8(row + j0, v);
#pragma unroll
        for (int k = 0; k < detail::kVec; ++k) f(j0 + k, v[k]);
      },
      [&](std::int64_t j) { f(j, to_float(row[j])); });
}

// Whether every row of a [tokens, vocab] array of T starting at p is 16-byte aligned.
template <class T>
bool rows_aligned(const T* p, std::int64_t vocab) {
  return detail::aligned16(p) && (vocab * static_cast<std::int64_t>(sizeof(T))) % 16 == 0;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_max_kernel(std::int64_t vocab, std::int64_t real, const T* logits, bool vec, float* max) {
  __shared__ float shared[32];
  const T* row = logits + static_cast<std::int64_t>(blockIdx.x) * vocab;
  float m = kNegInf;
  for_each_in_row(row, real, vec, [&](std::int64_t, float x) { m = fmaxf(m, x); });
  m = block_reduce(m, MaxOp{}, kNegInf, shared);
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_sum_exp_kernel(std::int64_t vocab, std::int64_t real, const T* logits, const std::int32_t* targets,
                      std::int64_t begin, bool vec, const float* max, float* sum_exp, float* target_logit) {
  __shared__ float shared[32];
  const std::int64_t t = blockIdx.x;
  const T* row = logits + t * vocab;
  const float m = max[t];
  float s = 0.0f;
  for_each_in_row(row, real, vec, [&](std::int64_t, float x) { s += expf(x - m); });
  s = block_reduce(s, SumOp{}, 0.0f, shared);
  if (threadIdx.x == 0) {
    sum_exp[t] = s;
    const std::int64_t local = static_cast<std::int64_t>(targets[t]) - begin;
    target_logit[t] = (local >= 0 && local < vocab) ? to_float(row[local]) : 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads) ce_loss_kernel(std::int64_t tokens, const float* max, const float* sum_exp,
                                                           const float* target_logit, float* loss, double* mean) {
  __shared__ double shared[32];
  double total = 0.0;
  for (std::int64_t t = threadIdx.x; t < tokens; t += blockDim.x) {
    const float l = logf(sum_exp[t]) + (max[t] - target_logit[t]);
    loss[t] = l;
    total += static_cast<double>(l);
  }
  total = block_reduce(total, SumOp{}, 0.0, shared);
  if (threadIdx.x == 0 && mean != nullptr) *mean = tokens > 0 ? total / static_cast<double>(tokens) : 0.0;
}

// out[t, j] = exp(logits[t, j] - max) * (dloss / sum_exp), minus dloss at the target; 0 in the padding columns
// [real, vocab). Each element is read and then written by the same thread, so out may alias logits.
template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(std::int64_t vocab, std::int64_t real, const T* logits, const std::int32_t* targets,
                       std::int64_t begin, bool vec, const float* max, const float* sum_exp, const float* dloss,
                       T* dlogits) {
  const std::int64_t t = blockIdx.x;
  const T* row = logits + t * vocab;
  T* out = dlogits + t * vocab;
  const float m = max[t];
  const float d = dloss[t];
  const float scale = d / sum_exp[t];
  const std::int64_t target = static_cast<std::int64_t>(targets[t]) - begin;
  auto grad = [&](std::int64_t j, float x) {
    const float p = j < real ? expf(x - m) * scale : 0.0f;
    return j == target ? p - d : p;
  };
  detail::over_row(
      vocab, vec,  // out's rows are aligned as the logits' (the same shape)
      [&](std::int64_t j0) {
        float v[detail::kVec];
        detail::load8(row + j0, v);
#pragma unroll
        for (int k = 0; k < detail::kVec; ++k) v[k] = grad(j0 + k, v[k]);
        detail::store8(out + j0, v);
      },
      [&](std::int64_t j) { detail::store_as(out + j, grad(j, to_float(row[j]))); });
}

void check_tokens(std::int64_t tokens, VocabShard shard, const char* name) {
  DTRAIN_CHECK(tokens >= 0 && tokens <= 0x7fffffff, std::string(name) + ": token count out of range");
  DTRAIN_CHECK(shard.size() > 0, std::string(name) + ": empty vocabulary shard");
}

template <class T>
void max_impl(Context& ctx, std::int64_t tokens, const T* logits, VocabShard shard, float* max) {
  check_tokens(tokens, shard, "cross_entropy_max");
  if (tokens == 0) return;
  ce_max_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream_of(ctx)>>>(
      shard.size(), shard.real_size(), logits, rows_aligned(logits, shard.size()), max);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "cross_entropy_max");
}

template <class T>
void sum_exp_impl(Context& ctx, std::int64_t tokens, const T* logits, const std::int32_t* targets, VocabShard shard,
                  const float* max, float* sum_exp, float* target_logit) {
  check_tokens(tokens, shard, "cross_entropy_sum_exp");
  if (tokens == 0) return;
  ce_sum_exp_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream_of(ctx)>>>(
      shard.size(), shard.real_size(), logits, targets, shard.begin, rows_aligned(logits, shard.size()), max, sum_exp,
      target_logit);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "cross_entropy_sum_exp");
}

template <class T>
void backward_impl(Context& ctx, std::int64_t tokens, const T* logits, const std::int32_t* targets, VocabShard shard,
                   const float* max, const float* sum_exp, const float* dloss, T* dlogits) {
  check_tokens(tokens, shard, "cross_entropy_backward");
  if (tokens == 0) return;
  ce_backward_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream_of(ctx)>>>(
      shard.size(), shard.real_size(), logits, targets, shard.begin,
      rows_aligned(logits, shard.size()) && rows_aligned(dlogits, shard.size()), max, sum_exp, dloss, dlogits);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "cross_entropy_backward");
}

}  // namespace

void cross_entropy_max(Context& ctx, std::int64_t tokens, const bf16* logits, VocabShard shard, float* max) {
  max_impl(ctx, tokens, as_device(logits), shard, max);
}
void cross_entropy_max(Context& ctx, std::int64_t tokens, const float* logits, VocabShard shard, float* max) {
  max_impl(ctx, tokens, logits, shard, max);
}

void cross_entropy_sum_exp(Context& ctx, std::int64_t tokens, const bf16* logits, const std::int32_t* targets,
                           VocabShard shard, const float* max, float* sum_exp, float* target_logit) {
  sum_exp_impl(ctx, tokens, as_device(logits), targets, shard, max, sum_exp, target_logit);
}
void cross_entropy_sum_exp(Context& ctx, std::int64_t tokens, const float* logits, const std::int32_t* targets,
                           VocabShard shard, const float* max, float* sum_exp, float* target_logit) {
  sum_exp_impl(ctx, tokens, logits, targets, shard, max, sum_exp, target_logit);
}

void cross_entropy_loss(Context& ctx, std::int64_t tokens, const float* max, const float* sum_exp,
                        const float* target_logit, float* loss, double* mean) {
  DTRAIN_CHECK(tokens >= 0, "cross_entropy_loss: negative token count");
  if (tokens == 0 && mean == nullptr) return;
  // One block: the loss is a few thousand floats per micro-batch; one block keeps the float64 sum in one fixed order.
  ce_loss_kernel<<<1, kThreads, 0, stream_of(ctx)>>>(tokens, max, sum_exp, target_logit, loss, mean);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "cross_entropy_loss");
}

void cross_entropy_backward(Context& ctx, std::int64_t tokens, const bf16* logits, const std::int32_t* targets,
                            VocabShard shard, const float* max, const float* sum_exp, const float* dloss,
                            bf16* dlogits) {
  backward_impl(ctx, tokens, as_device(logits), targets, shard, max, sum_exp, dloss, as_device(dlogits));
}
void cross_entropy_backward(Context& ctx, std::int64_t tokens, const float* logits, const std::int32_t* targets,
                            VocabShard shard, const float* max, const float* sum_exp, const float* dloss,
                            float* dlogits) {
  backward_impl(ctx, tokens, logits, targets, shard, max, sum_exp, dloss, dlogits);
}

}  // namespace dtrain::kernels::cuda
