#include "dtrain/kernels/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace dtrain::kernels::cpu {

namespace {

// mean == nullptr: RMSNorm (no centring, no beta).
DTRAIN_KERNEL_CLONES void norm_forward_rows(std::int64_t begin, std::int64_t end, std::int64_t h, const float* x,
                                            const float* gamma, const float* beta, float eps, float* y, float* mean,
                                            float* rstd) {
  const float inv_h = 1.0f / static_cast<float>(h);
  for (std::int64_t t = begin; t < end; ++t) {
    const float* xr = x + t * h;
    float* yr = y + t * h;
    float mu = 0.0f;
    if (mean != nullptr) {
      mu = vec::sum(xr, h) * inv_h;
      mean[t] = mu;
    }
    const float r = 1.0f / std::sqrt(vec::sum_sq_dev(xr, mu, h) * inv_h + eps);
    rstd[t] = r;
    if (beta != nullptr) {
      for (std::int64_t j = 0; j < h; ++j) yr[j] = (xr[j] - mu) * r * gamma[j] + beta[j];
    } else {
      for (std::int64_t j = 0; j < h; ++j) yr[j] = (xr[j] - mu) * r * gamma[j];
    }
  }
}

// dx for rows [begin, end). mean == nullptr: RMSNorm.
DTRAIN_KERNEL_CLONES void norm_backward_rows(std::int64_t begin, std::int64_t end, std::int64_t h, const float* x,
                                             const float* gamma, const float* mean, const float* rstd, const float* dy,
                                             float* dx) {
  const float inv_h = 1.0f / static_cast<float>(h);
  for (std::int64_t t = begin; t < end; ++t) {
    const float* xr = x + t * h;
    const float* dyr = dy + t * h;
    float* dxr = dx + t * h;
    const float mu = mean != nullptr ? mean[t] : 0.0f;
    const float r = rstd[t];
    // dxr holds g = dy * gamma first, then the result (no scratch buffer).
    float acc_g[vec::kLanes] = {};
    float acc_gx[vec::kLanes] = {};
    std::int64_t j = 0;
    for (; j + vec::kLanes <= h; j += vec::kLanes) {
      for (int k = 0; k < vec::kLanes; ++k) {
        const float g = dyr[j + k] * gamma[j + k];
        dxr[j + k] = g;
        acc_g[k] += g;
        acc_gx[k] += g * ((xr[j + k] - mu) * r);
      }
    }
    for (int k = 0; j + k < h; ++k) {
      const float g = dyr[j + k] * gamma[j + k];
      dxr[j + k] = g;
      acc_g[k] += g;
      acc_gx[k] += g * ((xr[j + k] - mu) * r);
    }
    const float mean_g = mean != nullptr ? vec::combine(acc_g) * inv_h : 0.0f;
    const float mean_gx = vec::combine(acc_gx) * inv_h;
    for (std::int64_t i = 0; i < h; ++i) dxr[i] = r * (dxr[i] - mean_g - ((xr[i] - mu) * r) * mean_gx);
  }
}

// dgamma[j] += sum_t dy[t, j] * xhat[t, j], dbeta[j] += sum_t dy[t, j] for columns [c_begin, c_end): tokens in order
// into a zeroed accumulator, then added, so the result is the same for every split of the columns.
DTRAIN_KERNEL_CLONES void norm_param_grad_columns(std::int64_t c_begin, std::int64_t c_end, std::int64_t rows,
                                                  std::int64_t h, const float* x, const float* mean, const float* rstd,
                                                  const float* dy, float* dgamma, float* dbeta) {
  constexpr std::int64_t kBlock = 256;
  float acc_w[kBlock];
  float acc_b[kBlock];
  for (std::int64_t c0 = c_begin; c0 < c_end; c0 += kBlock) {
    const std::int64_t n = std::min(kBlock, c_end - c0);
    for (std::int64_t k = 0; k < n; ++k) acc_w[k] = acc_b[k] = 0.0f;
    for (std::int64_t t = 0; t < rows; ++t) {
      const float* xr = x + t * h + c0;
      const float* dyr = dy + t * h + c0;
      const float mu = mean != nullptr ? mean[t] : 0.0f;
      const float r = rstd[t];
      for (std::int64_t k = 0; k < n; ++k) {
        acc_w[k] += dyr[k] * ((xr[k] - mu) * r);
        acc_b[k] += dyr[k];
      }
    }
    for (std::int64_t k = 0; k < n; ++k) dgamma[c0 + k] += acc_w[k];
    if (dbeta != nullptr) {
      for (std::int64_t k = 0; k < n; ++k) dbeta[c0 + k] += acc_b[k];
    }
  }
}

// One pass over the rows when a single thread does the work: dx row by row, and the parameter gradients summed into
// zeroed accumulators in token order, then added. That is the same sequence of float operations as
// norm_param_grad_columns, so the result is bitwise the same as the two-pass threaded path.
DTRAIN_KERNEL_CLONES void norm_backward_fused(std::int64_t rows, std::int64_t h, const float* x, const float* gamma,
                                              const float* mean, const float* rstd, const float* dy, float* dx,
                                              float* dgamma, float* dbeta, float* acc_w, float* acc_b) {
  std::fill(acc_w, acc_w + h, 0.0f);
  std::fill(acc_b, acc_b + h, 0.0f);
  for (std::int64_t t = 0; t < rows; ++t) {
    norm_backward_rows(t, t + 1, h, x, gamma, mean, rstd, dy, dx);
    const float* xr = x + t * h;
    const float* dyr = dy + t * h;
    const float mu = mean != nullptr ? mean[t] : 0.0f;
    const float r = rstd[t];
    for (std::int64_t j = 0; j < h; ++j) {
      acc_w[j] += dyr[j] * ((xr[j] - mu) * r);
      acc_b[j] += dyr[j];
    }
  }
  for (std::int64_t j = 0; j < h; ++j) dgamma[j] += acc_w[j];
  if (dbeta != nullptr) {
    for (std::int64_t j = 0; j < h; ++j) dbeta[j] += acc_b[j];
  }
}

void norm_backward(const NormShape& s, const float* x, const float* gamma, const float* mean, const float* rstd,
                   const float* dy, float* dx, float* dgamma, float* dbeta) {
  if (kernel_threads() == 1) {
    std::vector<float> acc(static_cast<std::size_t>(2 * s.hidden));
    norm_backward_fused(s.rows, s.hidden, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, acc.data(),
                        acc.data() + s.hidden);
    return;
  }
  parallel_ranges(s.rows, s.hidden, [&](std::int64_t b, std::int64_t e) {
    norm_backward_rows(b, e, s.hidden, x, gamma, mean, rstd, dy, dx);
  });
  parallel_ranges(s.hidden, s.rows, [&](std::int64_t b, std::int64_t e) {
    norm_param_grad_columns(b, e, s.rows, s.hidden, x, mean, rstd, dy, dgamma, dbeta);
  });
}

}  // namespace

void layernorm_forward(const NormShape& s, const float* x, const float* gamma, const float* beta, float eps, float* y,
                       float* mean, float* rstd) {
  parallel_ranges(s.rows, s.hidden, [&](std::int64_t b, std::int64_t e) {
    norm_forward_rows(b, e, s.hidden, x, gamma, beta, eps, y, mean, rstd);
  });
}

void layernorm_backward(const NormShape& s, const float* x, const float* gamma, const float* mean, const float* rstd,
                        const float* dy, float* dx, float* dgamma, float* dbeta) {
  norm_backward(s, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
}

void rmsnorm_forward(const NormShape& s, const float* x, const float* gamma, float eps, float* y, float* rstd) {
  parallel_ranges(s.rows, s.hidden, [&](std::int64_t b, std::int64_t e) {
    norm_forward_rows(b, e, s.hidden, x, gamma, nullptr, eps, y, nullptr, rstd);
  });
}

void rmsnorm_backward(const NormShape& s, const float* x, const float* gamma, const float* rstd, const float* dy,
                      float* dx, float* dgamma) {
  norm_backward(s, x, gamma, nullptr, rstd, dy, dx, dgamma, nullptr);
}

}  // namespace dtrain::kernels::cpu
