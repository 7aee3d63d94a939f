#include "dtrain/kernels/moe.h"

#include <cmath>
#include <cstddef>

namespace dtrain::kernels::cpu {

void moe_route(const MoeRouteShape& s, const float* logits, float* probs, std::int32_t* expert, float* gate) {
  const std::int64_t E = s.experts, K = s.top_k;
  for (std::int64_t t = 0; t < s.tokens; ++t) {
    const float* x = logits + t * E;
    float* p = probs + t * E;
    float max = x[0];
    for (std::int64_t e = 1; e < E; ++e) max = std::fmax(max, x[e]);
    float sum = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(x[e] - max);
      sum += p[e];
    }
    for (std::int64_t e = 0; e < E; ++e) p[e] /= sum;
    // Top-k by repeated selection: the largest not yet taken, the lower index on ties.
    std::int32_t* ex = expert + t * K;
    float* g = gate + t * K;
    float chosen = 0;
    for (std::int64_t j = 0; j < K; ++j) {
      std::int32_t best = -1;
      for (std::int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (std::int64_t i = 0; i < j; ++i) taken = taken || ex[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<std::int32_t>(e);
      }
      ex[j] = best;
      g[j] = p[best];
      chosen += p[best];
    }
    if (s.normalize) {
      for (std::int64_t j = 0; j < K; ++j) g[j] /= chosen;
    }
  }
}

void moe_route_backward(const MoeRouteShape& s, const float* probs, const std::int32_t* expert, const float* dgate,
                        const float* aux_grad, std::int64_t seq_len, float* dlogits) {
  const std::int64_t E = s.experts, K = s.top_k;
  for (std::int64_t t = 0; t < s.tokens; ++t) {
    const float* p = probs + t * E;
    const std::int32_t* ex = expert + t * K;
    const float* dg = dgate + t * K;
    float* dl = dlogits + t * E;  // first the gradient on the probabilities, then on the logits
    for (std::int64_t e = 0; e < E; ++e) dl[e] = aux_grad != nullptr ? aux_grad[(t / seq_len) * E + e] : 0.0f;
    if (s.normalize) {
      // gate_j = p_j / S, S = sum of the chosen p: d p_j = (dgate_j - sum_i dgate_i gate_i) / S.
      float sum = 0, dot = 0;
      for (std::int64_t j = 0; j < K; ++j) sum += p[ex[j]];
      for (std::int64_t j = 0; j < K; ++j) dot += dg[j] * (p[ex[j]] / sum);
      for (std::int64_t j = 0; j < K; ++j) dl[ex[j]] += (dg[j] - dot) / sum;
    } else {
      for (std::int64_t j = 0; j < K; ++j) dl[ex[j]] += dg[j];
    }
    // Softmax: dlogit_e = p_e (dp_e - sum_i p_i dp_i).
    float pd = 0;
    for (std::int64_t e = 0; e < E; ++e) pd += p[e] * dl[e];
    for (std::int64_t e = 0; e < E; ++e) dl[e] = p[e] * (dl[e] - pd);
  }
}

void moe_gather_rows(std::int64_t n, std::int64_t cols, const float* src, const std::int32_t* rows, float* dst) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float* from = src + static_cast<std::int64_t>(rows[i]) * cols;
    for (std::int64_t c = 0; c < cols; ++c) dst[i * cols + c] = from[c];
  }
}

void moe_unpermute(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const float* src,
                   const std::int32_t* slot, const float* weight, bool accumulate, float* out) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    float* o = out + t * cols;
    if (!accumulate) {
      for (std::int64_t c = 0; c < cols; ++c) o[c] = 0;
    }
    for (std::int64_t j = 0; j < top_k; ++j) {
      const std::int32_t row = slot[t * top_k + j];
      if (row < 0) continue;
      const float w = weight != nullptr ? weight[t * top_k + j] : 1.0f;
      const float* x = src + static_cast<std::int64_t>(row) * cols;
      for (std::int64_t c = 0; c < cols; ++c) o[c] += w * x[c];
    }
  }
}

void moe_unpermute_backward(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const float* dout,
                            const float* src, const std::int32_t* slot, const float* gate, float* dsrc, float* dgate) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* d = dout + t * cols;
    for (std::int64_t j = 0; j < top_k; ++j) {
      const std::int32_t row = slot[t * top_k + j];
      if (row < 0) {
        dgate[t * top_k + j] = 0;
        continue;
      }
      const float g = gate[t * top_k + j];
      const float* x = src + static_cast<std::int64_t>(row) * cols;
      float* dx = dsrc + static_cast<std::int64_t>(row) * cols;
      float dot = 0;
      for (std::int64_t c = 0; c < cols; ++c) {
        dx[c] = g * d[c];
        dot += d[c] * x[c];
      }
      dgate[t * top_k + j] = dot;
    }
  }
}

}  // namespace dtrain::kernels::cpu
