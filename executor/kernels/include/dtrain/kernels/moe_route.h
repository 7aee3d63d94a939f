// The router's arithmetic for one token: the one definition that the CPU kernel (cpu/moe.cc) and the CUDA kernel
// (cuda/moe.cu, one thread per token) both call, so that the two backends route alike (dtrain/kernels/moe.h has the
// layouts). `Logits` is any indexable whose elements convert to float (fp32 on the host, bf16 on the device).
#pragma once

#include <math.h>  // expf, fmaxf: the C spellings both compilers know on both sides

#include <cstdint>

#include "dtrain/common/host_device.h"

namespace dtrain::kernels {

// probs[e] = softmax(logits)[e]; expert[0..K) the K largest (the lower index on ties); gate[j] = probs[expert[j]],
// divided by their sum with `normalize`.
template <class Logits>
DTRAIN_HOST_DEVICE inline void route_token(std::int64_t experts, std::int64_t top_k, bool normalize,
                                           const Logits& logits, float* probs, std::int32_t* expert, float* gate) {
  float max = static_cast<float>(logits[0]);
  for (std::int64_t e = 1; e < experts; ++e) max = fmaxf(max, static_cast<float>(logits[e]));
  float sum = 0.0f;
  for (std::int64_t e = 0; e < experts; ++e) {
    probs[e] = expf(static_cast<float>(logits[e]) - max);
    sum += probs[e];
  }
  for (std::int64_t e = 0; e < experts; ++e) probs[e] /= sum;
  float chosen = 0.0f;
  for (std::int64_t j = 0; j < top_k; ++j) {
    std::int32_t best = -1;
    for (std::int64_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (std::int64_t i = 0; i < j; ++i) taken = taken || expert[i] == e;
      if (!taken && (best < 0 || probs[e] > probs[best])) best = static_cast<std::int32_t>(e);
    }
    expert[j] = best;
    gate[j] = probs[best];
    chosen += probs[best];
  }
  if (normalize) {
    for (std::int64_t j = 0; j < top_k; ++j) gate[j] /= chosen;
  }
}

// The gradient on probability e of one token: the load-balancing term `aux` plus the gates' (dgate in the order of
// expert[]); sum and dot are the token's sum of chosen probabilities and sum_j dgate_j gate_j (normalize only).
DTRAIN_HOST_DEVICE inline float route_prob_grad(std::int64_t top_k, bool normalize, const std::int32_t* expert,
                                                const float* dgate, float aux, float sum, float dot, std::int64_t e) {
  float d = aux;
  for (std::int64_t j = 0; j < top_k; ++j) {
    if (expert[j] == e) d += normalize ? (dgate[j] - dot) / sum : dgate[j];
  }
  return d;
}

// dlogits[e] for one token: the softmax's backward of route_prob_grad, written through `store(e, value)`.
template <class Store>
DTRAIN_HOST_DEVICE inline void route_token_backward(std::int64_t experts, std::int64_t top_k, bool normalize,
                                                    const float* probs, const std::int32_t* expert, const float* dgate,
                                                    const float* aux, const Store& store) {
  float sum = 0.0f, dot = 0.0f;
  if (normalize) {
    for (std::int64_t j = 0; j < top_k; ++j) sum += probs[expert[j]];
    for (std::int64_t j = 0; j < top_k; ++j) dot += dgate[j] * (probs[expert[j]] / sum);
  }
  float pd = 0.0f;
  for (std::int64_t e = 0; e < experts; ++e) {
    pd += probs[e] * route_prob_grad(top_k, normalize, expert, dgate, aux != nullptr ? aux[e] : 0.0f, sum, dot, e);
  }
  for (std::int64_t e = 0; e < experts; ++e) {
    const float d = route_prob_grad(top_k, normalize, expert, dgate, aux != nullptr ? aux[e] : 0.0f, sum, dot, e);
    store(e, probs[e] * (d - pd));
  }
}

}  // namespace dtrain::kernels
