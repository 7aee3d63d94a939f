#include "dtrain/kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/parallel.h"
#include "cpu/vec.h"
#include "dtrain/common/error.h"

namespace dtrain::kernels::cpu {

namespace {

// Elements per partial sum of the gradient norm: a constant, so the sum's order never depends on the thread count.
constexpr std::int64_t kNormBlock = 4096;

struct AdamWScalars {
  float decay_factor;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float grad_scale;
};

DTRAIN_KERNEL_CLONES void adamw_range(std::int64_t begin, std::int64_t end, const AdamWScalars& c, bool decay,
                                      float* param, const float* grad, float* m, float* v) {
  for (std::int64_t i = begin; i < end; ++i) {
    const float g = grad[i] * c.grad_scale;
    float p = param[i];
    if (decay) p = p * c.decay_factor;
    const float mi = m[i] * c.beta1 + g * c.one_minus_beta1;
    const float vi = v[i] * c.beta2 + (c.one_minus_beta2 * g) * g;  // addcmul's order: (value * g) * g
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / c.bias_correction2_sqrt + c.eps;
    param[i] = p - c.step_size * (mi / denom);
  }
}

DTRAIN_KERNEL_CLONES double sum_squares_block(const float* x, std::int64_t n) {
  // float lanes inside a block (exact enough: a block is 4096 elements), float64 across blocks.
  double acc[vec::kLanes] = {};
  std::int64_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) {
    for (int k = 0; k < vec::kLanes; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  for (int k = 0; i + k < n; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (int width = vec::kLanes / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  return acc[0];
}

DTRAIN_KERNEL_CLONES void scale_range(std::int64_t begin, std::int64_t end, float factor, float* x) {
  for (std::int64_t i = begin; i < end; ++i) x[i] *= factor;
}

}  // namespace

void adamw_step(const AdamWConfig& cfg, const AdamWBuffer* buffers, std::int64_t count) {
  DTRAIN_CHECK(cfg.step >= 1, "adamw_step: step is 1-based");
  const double t = static_cast<double>(cfg.step);
  const AdamWScalars c{static_cast<float>(1.0 - cfg.lr * cfg.weight_decay),
                       static_cast<float>(cfg.beta1),
                       static_cast<float>(1.0 - cfg.beta1),
                       static_cast<float>(cfg.beta2),
                       static_cast<float>(1.0 - cfg.beta2),
                       static_cast<float>(cfg.lr / (1.0 - std::pow(cfg.beta1, t))),
                       static_cast<float>(std::sqrt(1.0 - std::pow(cfg.beta2, t))),
                       static_cast<float>(cfg.eps),
                       static_cast<float>(cfg.grad_scale)};
  for (std::int64_t b = 0; b < count; ++b) {
    const AdamWBuffer& buf = buffers[b];
    parallel_ranges(buf.numel, 1, [&](std::int64_t begin, std::int64_t end) {
      adamw_range(begin, end, c, buf.decay, buf.param, buf.grad, buf.m, buf.v);
    });
  }
}

double grad_norm_squared(const GradBuffer* buffers, std::int64_t count) {
  double total = 0.0;
  std::vector<double> partial;
  for (std::int64_t b = 0; b < count; ++b) {
    const GradBuffer& buf = buffers[b];
    const std::int64_t blocks = (buf.numel + kNormBlock - 1) / kNormBlock;
    partial.assign(static_cast<std::size_t>(blocks), 0.0);
    parallel_ranges(blocks, kNormBlock, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k) {
        const std::int64_t first = k * kNormBlock;
        partial[static_cast<std::size_t>(k)] =
            sum_squares_block(buf.grad + first, std::min(kNormBlock, buf.numel - first));
      }
    });
    for (double p : partial) total += p;
  }
  return total;
}

void scale(std::int64_t n, float factor, float* x) {
  parallel_ranges(n, 1, [&](std::int64_t b, std::int64_t e) { scale_range(b, e, factor, x); });
}

}  // namespace dtrain::kernels::cpu
