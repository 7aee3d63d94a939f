#include "dtrain/kernels/optimizer.h"

#include <algorithm>
#include <vector>

#include "cpu/parallel.h"
#include "cpu/vec.h"
#include "dtrain/common/error.h"
#include "dtrain/kernels/adamw_update.h"

namespace dtrain::kernels::cpu {

namespace {

// Elements per partial sum of the gradient norm: a constant, so the sum's order never depends on the thread count.
constexpr std::int64_t kNormBlock = 4096;

// adamw_update (adamw_update.h) inlined into each clone; this file is compiled with -ffp-contract=off (see there).
DTRAIN_KERNEL_CLONES void adamw_range(std::int64_t begin, std::int64_t end, const AdamWScalars& c, bool decay,
                                      float* param, const float* grad, float* m, float* v) {
  for (std::int64_t i = begin; i < end; ++i) {
    const AdamWElement e = adamw_update(c, decay, param[i], grad[i], m[i], v[i]);
    m[i] = e.m;
    v[i] = e.v;
    param[i] = e.param;
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
  const AdamWScalars c = adamw_scalars(cfg);
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
