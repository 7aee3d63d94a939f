#include "dtrain/kernels/moe.h"

#include <cmath>
#include <cstddef>

#include "dtrain/kernels/moe_route.h"

namespace dtrain::kernels::cpu {

void moe_route(const MoeRouteShape& s, const float* logits, float* probs, std::int32_t* expert, float* gate) {
  for (std::int64_t t = 0; t < s.tokens; ++t) {
    route_token(s.experts, s.top_k, s.normalize, logits + t * s.experts, probs + t * s.experts, expert + t * s.top_k,
                gate + t * s.top_k);
  }
}

void moe_route_backward(const MoeRouteShape& s, const float* probs, const std::int32_t* expert, const float* dgate,
                        const float* aux_grad, std::int64_t seq_len, float* dlogits) {
  const std::int64_t E = s.experts, K = s.top_k;
  for (std::int64_t t = 0; t < s.tokens; ++t) {
    float* dl = dlogits + t * E;
    route_token_backward(E, K, s.normalize, probs + t * E, expert + t * K, dgate + t * K,
                         aux_grad != nullptr ? aux_grad + (t / seq_len) * E : nullptr,
                         [dl](std::int64_t e, float v) { dl[e] = v; });
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

void moe_sigmoid_gate(std::int64_t tokens, const float* z, float* g) {
  for (std::int64_t t = 0; t < tokens; ++t) g[t] = 1.0f / (1.0f + expf(-z[t]));
}

void moe_sigmoid_gate_backward(std::int64_t tokens, const float* g, const float* dg, float* dz) {
  for (std::int64_t t = 0; t < tokens; ++t) dz[t] = g[t] * (1.0f - g[t]) * dg[t];
}

}  // namespace dtrain::kernels::cpu
