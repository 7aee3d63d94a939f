// Vocab-parallel cross entropy on the GPU, in dtrain/kernels/cross_entropy.h's phases (the caller all-reduces over
// the tensor-parallel group between them), with the same layouts.
//
// Logits come as bf16 (the output of a bf16 linear_forward, as PyTorch's autocast produces them) or fp32 (the fp32
// overload of linear_forward); each phase has an overload for both, and dlogits has the logits' type (it may alias
// the logits). Every per-token statistic (max, sum_exp, target_logit, loss, dloss) is fp32 and computed in fp32
// (expf, logf); one thread block per token, block reductions in a fixed order.
#pragma once

#include <cstdint>

#include "dtrain/kernels/cross_entropy.h"
#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda {

// Phase 1: max[t] = max_j logits[t, j].
void cross_entropy_max(Context& ctx, std::int64_t tokens, const bf16* logits, VocabShard shard, float* max);
void cross_entropy_max(Context& ctx, std::int64_t tokens, const float* logits, VocabShard shard, float* max);

// Phase 2: sum_exp[t] = sum_j exp(logits[t, j] - max[t]); target_logit[t] = the target's logit if in the shard, else 0.
void cross_entropy_sum_exp(Context& ctx, std::int64_t tokens, const bf16* logits, const std::int32_t* targets,
                           VocabShard shard, const float* max, float* sum_exp, float* target_logit);
void cross_entropy_sum_exp(Context& ctx, std::int64_t tokens, const float* logits, const std::int32_t* targets,
                           VocabShard shard, const float* max, float* sum_exp, float* target_logit);

// Phase 3: loss[t] = log(sum_exp[t]) + max[t] - target_logit[t]. When mean is not nullptr, *mean (a device double)
// gets the mean over the tokens, summed in float64 in a fixed order (0 for no tokens). The CPU backend returns the
// mean; here it stays on the device so that the step need not wait for it.
void cross_entropy_loss(Context& ctx, std::int64_t tokens, const float* max, const float* sum_exp,
                        const float* target_logit, float* loss, double* mean);

// dlogits[t, j] = (softmax[t, j] - onehot[t, j]) * dloss[t]. dlogits may alias logits.
void cross_entropy_backward(Context& ctx, std::int64_t tokens, const bf16* logits, const std::int32_t* targets,
                            VocabShard shard, const float* max, const float* sum_exp, const float* dloss,
                            bf16* dlogits);
void cross_entropy_backward(Context& ctx, std::int64_t tokens, const float* logits, const std::int32_t* targets,
                            VocabShard shard, const float* max, const float* sum_exp, const float* dloss,
                            float* dlogits);

}  // namespace dtrain::kernels::cuda
