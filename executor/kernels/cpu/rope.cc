#include "dtrain/kernels/rope.h"

#include "cpu/parallel.h"
#include "cpu/vec.h"
#include "dtrain/common/error.h"

namespace dtrain::kernels::cpu {

namespace {

// sign = +1: forward rotation; -1: backward (inverse) rotation.
DTRAIN_KERNEL_CLONES void rotate_rows(std::int64_t begin, std::int64_t end, const RopeShape& s, const float* cos,
                                      const float* sin, float sign, float* x) {
  const std::int64_t half = s.head_dim / 2;
  for (std::int64_t t = begin; t < end; ++t) {
    const std::int64_t p = t % s.seq;
    const float* c = cos + p * half;
    const float* sn = sin + p * half;
    for (std::int64_t h = 0; h < s.n_heads; ++h) {
      float* lo = x + t * s.row_stride + h * s.head_dim;
      float* hi = lo + half;
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = lo[i];
        const float b = hi[i];
        const float si = sign * sn[i];
        lo[i] = a * c[i] - b * si;
        hi[i] = b * c[i] + a * si;
      }
    }
  }
}

void rotate(const RopeShape& s, const float* cos, const float* sin, float sign, float* x) {
  DTRAIN_CHECK(s.head_dim % 2 == 0, "rope: head_dim must be even");
  DTRAIN_CHECK(s.row_stride >= s.n_heads * s.head_dim, "rope: row_stride smaller than the heads it holds");
  if (s.seq <= 0) return;
  parallel_ranges(s.batch * s.seq, s.n_heads * s.head_dim,
                  [&](std::int64_t b, std::int64_t e) { rotate_rows(b, e, s, cos, sin, sign, x); });
}

}  // namespace

void rope_forward(const RopeShape& shape, const float* cos, const float* sin, float* x) {
  rotate(shape, cos, sin, 1.0f, x);
}

void rope_backward(const RopeShape& shape, const float* cos, const float* sin, float* dx) {
  rotate(shape, cos, sin, -1.0f, dx);
}

}  // namespace dtrain::kernels::cpu
