// LayerNorm (Ba et al. 2016, GPT) and RMSNorm (Zhang & Sennrich 2019, Llama) over the hidden dimension of each token.
//
//   LayerNorm: mean = (1/h) sum_j x_j,  var = (1/h) sum_j (x_j - mean)^2 (biased, as PyTorch),
//              rstd = 1 / sqrt(var + eps),  y_j = (x_j - mean) * rstd * gamma_j + beta_j
//   RMSNorm:   rstd = 1 / sqrt((1/h) sum_j x_j^2 + eps),  y_j = x_j * rstd * gamma_j
//
// Forward saves mean (LayerNorm) and rstd per token for backward. Backward, with xhat = normalised x and
// g = dy * gamma:
//   LayerNorm: dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)),  dgamma += sum_t dy * xhat,  dbeta += sum_t dy
//   RMSNorm:   dx = rstd * (g - xhat * mean_j(g * xhat)),               dgamma += sum_t dy * xhat
//
// Layouts (row-major, contiguous): x, y, dy, dx [rows, hidden]; gamma, beta, dgamma, dbeta [hidden]; mean, rstd
// [rows]. rows = tokens of the micro-batch (or of this rank's sequence slice with sequence parallelism). eps is
// ModelSpec::norm_eps. Norms are replicated over the tensor-parallel group: their weights are not split.
// dx is overwritten, dgamma/dbeta accumulated (+=); the token sums run in token order for every thread count.
#pragma once

#include <cstdint>

namespace dtrain::kernels {

struct NormShape {
  std::int64_t rows = 0;
  std::int64_t hidden = 0;
};

namespace cpu {

// beta may be nullptr (no bias).
void layernorm_forward(const NormShape& shape, const float* x, const float* gamma, const float* beta, float eps,
                       float* y, float* mean, float* rstd);
// dbeta may be nullptr (no bias).
void layernorm_backward(const NormShape& shape, const float* x, const float* gamma, const float* mean,
                        const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta);

void rmsnorm_forward(const NormShape& shape, const float* x, const float* gamma, float eps, float* y, float* rstd);
void rmsnorm_backward(const NormShape& shape, const float* x, const float* gamma, const float* rstd, const float* dy,
                      float* dx, float* dgamma);

}  // namespace cpu
}  // namespace dtrain::kernels
