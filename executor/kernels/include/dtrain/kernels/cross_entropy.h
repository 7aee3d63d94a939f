// Vocab-parallel softmax cross entropy (Megatron's vocab_parallel_cross_entropy), in phases so that the caller can
// all-reduce over the tensor-parallel group between them.
//
// Each rank holds the logits of its vocabulary slice [begin, end) for every token: logits [tokens, end - begin].
// Per token t with target y_t:
//   phase 1  cross_entropy_max:      m_t = max_j logits[t, j] over the local slice     -> caller all-reduces MAX
//   phase 2  cross_entropy_sum_exp:  e_t = sum_j exp(logits[t, j] - m_t) (local slice)  -> caller all-reduces SUM
//                                    z_t = logits[t, y_t - begin] if y_t is local, else 0 -> caller all-reduces SUM
//            (the two sums can travel in one all-reduce of 2 * tokens floats)
//   phase 3  cross_entropy_loss:     loss_t = log(e_t) + m_t - z_t  ( = -log softmax(logits)[y_t] ), and the mean
//   backward cross_entropy_backward: dlogits[t, j] = (exp(logits[t, j] - m_t) / e_t - [j == y_t - begin]) * dloss_t
// Padding columns (at or above the shard's real_end) are left out of the max and the sum and get dlogits = 0, so a
// padded vocabulary gives the unpadded model's loss and gradients; a slice of padding alone gives m_t = -inf and
// e_t = 0 (the other ranks' slices hold the real entries).
// With tp = 1 (one slice [0, vocab), no all-reduces) the phases compute ordinary cross entropy. Targets must lie in
// [0, vocab); a target outside every rank's slice would silently give z_t = 0 (the caller validates its data).
//
// Layouts: logits, dlogits [tokens, vocab_local] row-major contiguous; targets [tokens] int32 (full-vocabulary ids);
// max, sum_exp, target_logit, loss, dloss [tokens]. dlogits may alias logits (Megatron reuses the logits buffer).
#pragma once

#include <cstdint>

#include "dtrain/kernels/embedding.h"

namespace dtrain::kernels::cpu {

// Phase 1: max[t] = max_j logits[t, j].
void cross_entropy_max(std::int64_t tokens, const float* logits, VocabShard shard, float* max);

// Phase 2, with the all-reduced max: sum_exp[t] = sum_j exp(logits[t, j] - max[t]); target_logit[t] = the target's
// logit when the target is in this rank's slice, else 0.
void cross_entropy_sum_exp(std::int64_t tokens, const float* logits, const std::int32_t* targets, VocabShard shard,
                           const float* max, float* sum_exp, float* target_logit);

// Phase 3, with the all-reduced sums: loss[t] = log(sum_exp[t]) + max[t] - target_logit[t]. Returns the mean over the
// tokens, summed in float64 in token order (0 for no tokens).
double cross_entropy_loss(std::int64_t tokens, const float* max, const float* sum_exp, const float* target_logit,
                          float* loss);

// dlogits[t, j] = (softmax[t, j] - onehot[t, j]) * dloss[t] on the local slice. For the mean loss over N tokens
// (of the whole global batch) dloss[t] = 1 / N.
void cross_entropy_backward(std::int64_t tokens, const float* logits, const std::int32_t* targets, VocabShard shard,
                            const float* max, const float* sum_exp, const float* dloss, float* dlogits);

}  // namespace dtrain::kernels::cpu
