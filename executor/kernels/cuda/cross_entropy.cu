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

template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_max_kernel(std::int64_t vocab, std::int64_t real, const T* logits, float* max) {
  __shared__ float shared[32];
  const T* row = logits + static_cast<std::int64_t>(blockIdx.x) * vocab;
  float m = kNegInf;
  for (std::int64_t j = threadIdx.x; j < real; j += blockDim.x) m = fmaxf(m, to_float(row[j]));
  m = block_reduce(m, MaxOp{}, kNegInf, shared);
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_sum_exp_kernel(std::int64_t vocab, std::int64_t real, const T* logits, const std::int32_t* targets,
                      std::int64_t begin, const float* max, float* sum_exp, float* target_logit) {
  __shared__ float shared[32];
  const std::int64_t t = blockIdx.x;
  const T* row = logits + t * vocab;
  const float m = max[t];
  float s = 0.0f;
  for (std::int64_t j = threadIdx.x; j < real; j += blockDim.x) s += expf(to_float(row[j]) - m);
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
                       std::int64_t begin, const float* max, const float* sum_exp, const float* dloss, T* dlogits) {
  const std::int64_t t = blockIdx.x;
  const T* row = logits + t * vocab;
  T* out = dlogits + t * vocab;
  const float m = max[t];
  const float d = dloss[t];
  const float scale = d / sum_exp[t];
  const std::int64_t target = static_cast<std::int64_t>(targets[t]) - begin;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = j < real ? expf(to_float(row[j]) - m) * scale : 0.0f;
    detail::store_as(out + j, j == target ? p - d : p);
  }
}

void check_tokens(std::int64_t tokens, VocabShard shard, const char* name) {
  DTRAIN_CHECK(tokens >= 0 && tokens <= 0x7fffffff, std::string(name) + ": token count out of range");
  DTRAIN_CHECK(shard.size() > 0, std::string(name) + ": empty vocabulary shard");
}

template <class T>
void max_impl(Context& ctx, std::int64_t tokens, const T* logits, VocabShard shard, float* max) {
  check_tokens(tokens, shard, "cross_entropy_max");
  if (tokens == 0) return;
  ce_max_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream_of(ctx)>>>(shard.size(), shard.real_size(), logits,
                                                                                max);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "cross_entropy_max");
}

template <class T>
void sum_exp_impl(Context& ctx, std::int64_t tokens, const T* logits, const std::int32_t* targets, VocabShard shard,
                  const float* max, float* sum_exp, float* target_logit) {
  check_tokens(tokens, shard, "cross_entropy_sum_exp");
  if (tokens == 0) return;
  ce_sum_exp_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream_of(ctx)>>>(
      shard.size(), shard.real_size(), logits, targets, shard.begin, max, sum_exp, target_logit);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "cross_entropy_sum_exp");
}

template <class T>
void backward_impl(Context& ctx, std::int64_t tokens, const T* logits, const std::int32_t* targets, VocabShard shard,
                   const float* max, const float* sum_exp, const float* dloss, T* dlogits) {
  check_tokens(tokens, shard, "cross_entropy_backward");
  if (tokens == 0) return;
  ce_backward_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream_of(ctx)>>>(
      shard.size(), shard.real_size(), logits, targets, shard.begin, max, sum_exp, dloss, dlogits);
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
