#include "dtrain/kernels/cross_entropy.h"

#include <cmath>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace dtrain::kernels::cpu {

namespace {

// Rows of `v` columns, of which the first `n` are real vocabulary entries (vec::max of none is -inf).
DTRAIN_KERNEL_CLONES void max_rows(std::int64_t begin, std::int64_t end, std::int64_t v, std::int64_t n,
                                   const float* logits, float* max) {
  for (std::int64_t t = begin; t < end; ++t) max[t] = vec::max(logits + t * v, n);
}

DTRAIN_KERNEL_CLONES void sum_exp_rows(std::int64_t begin, std::int64_t end, const float* logits,
                                       const std::int32_t* targets, VocabShard shard, const float* max, float* sum_exp,
                                       float* target_logit) {
  const std::int64_t v = shard.size(), n = shard.real_size();
  for (std::int64_t t = begin; t < end; ++t) {
    const float* row = logits + t * v;
    const float m = max[t];
    float acc[vec::kLanes] = {};
    std::int64_t j = 0;
    for (; j + vec::kLanes <= n; j += vec::kLanes) {
      for (int k = 0; k < vec::kLanes; ++k) acc[k] += vec::exp_nonpos(row[j + k] - m);
    }
    for (int k = 0; j + k < n; ++k) acc[k] += vec::exp_nonpos(row[j + k] - m);
    sum_exp[t] = vec::combine(acc);
    target_logit[t] = shard.contains(targets[t]) ? row[targets[t] - shard.begin] : 0.0f;
  }
}

DTRAIN_KERNEL_CLONES void backward_rows(std::int64_t begin, std::int64_t end, const float* logits,
                                        const std::int32_t* targets, VocabShard shard, const float* max,
                                        const float* sum_exp, const float* dloss, float* dlogits) {
  const std::int64_t v = shard.size(), n = shard.real_size();
  for (std::int64_t t = begin; t < end; ++t) {
    const float* row = logits + t * v;
    float* out = dlogits + t * v;
    const float m = max[t];
    const float scale = dloss[t] / sum_exp[t];
    for (std::int64_t j = 0; j < n; ++j) out[j] = vec::exp_nonpos(row[j] - m) * scale;
    for (std::int64_t j = n; j < v; ++j) out[j] = 0.0f;
    if (shard.contains(targets[t])) out[targets[t] - shard.begin] -= dloss[t];
  }
}

}  // namespace

void cross_entropy_max(std::int64_t tokens, const float* logits, VocabShard shard, float* max) {
  parallel_ranges(tokens, shard.size(), [&](std::int64_t b, std::int64_t e) {
    max_rows(b, e, shard.size(), shard.real_size(), logits, max);
  });
}

void cross_entropy_sum_exp(std::int64_t tokens, const float* logits, const std::int32_t* targets, VocabShard shard,
                           const float* max, float* sum_exp, float* target_logit) {
  parallel_ranges(tokens, shard.size(), [&](std::int64_t b, std::int64_t e) {
    sum_exp_rows(b, e, logits, targets, shard, max, sum_exp, target_logit);
  });
}

double cross_entropy_loss(std::int64_t tokens, const float* max, const float* sum_exp, const float* target_logit,
                          float* loss) {
  double total = 0.0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    loss[t] = std::log(sum_exp[t]) + (max[t] - target_logit[t]);
    total += loss[t];
  }
  return tokens > 0 ? total / static_cast<double>(tokens) : 0.0;
}

void cross_entropy_backward(std::int64_t tokens, const float* logits, const std::int32_t* targets, VocabShard shard,
                            const float* max, const float* sum_exp, const float* dloss, float* dlogits) {
  parallel_ranges(tokens, shard.size(), [&](std::int64_t b, std::int64_t e) {
    backward_rows(b, e, logits, targets, shard, max, sum_exp, dloss, dlogits);
  });
}

}  // namespace dtrain::kernels::cpu
