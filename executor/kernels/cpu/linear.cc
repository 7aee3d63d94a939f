#include "dtrain/kernels/linear.h"

#include <cblas.h>

#include <algorithm>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace dtrain::kernels::cpu {

namespace {

// OpenBLAS takes int dimensions.
blasint blas_int(std::int64_t n) { return static_cast<blasint>(n); }

DTRAIN_KERNEL_CLONES void fill_bias_rows(std::int64_t begin, std::int64_t end, std::int64_t width, const float* bias,
                                         float* y) {
  for (std::int64_t t = begin; t < end; ++t) std::copy(bias, bias + width, y + t * width);
}

// db[o] += sum_t dy[t, o] for the columns [col_begin, col_end): rows in order, so the sum is the same for every
// thread count (threads split the columns, not the rows).
DTRAIN_KERNEL_CLONES void bias_grad_columns(std::int64_t col_begin, std::int64_t col_end, std::int64_t tokens,
                                            std::int64_t width, const float* dy, float* db) {
  constexpr std::int64_t kBlock = 256;
  float acc[kBlock];
  for (std::int64_t c0 = col_begin; c0 < col_end; c0 += kBlock) {
    const std::int64_t n = std::min(kBlock, col_end - c0);
    for (std::int64_t k = 0; k < n; ++k) acc[k] = 0.0f;
    for (std::int64_t t = 0; t < tokens; ++t) {
      const float* row = dy + t * width + c0;
      for (std::int64_t k = 0; k < n; ++k) acc[k] += row[k];
    }
    for (std::int64_t k = 0; k < n; ++k) db[c0 + k] += acc[k];
  }
}

}  // namespace

void linear_forward(const LinearShape& s, const float* x, const float* weight, const float* bias, float* y) {
  if (s.tokens == 0 || s.out_features == 0) return;
  float beta = 0.0f;
  if (bias != nullptr) {
    parallel_ranges(s.tokens, s.out_features,
                    [&](std::int64_t b, std::int64_t e) { fill_bias_rows(b, e, s.out_features, bias, y); });
    beta = 1.0f;
  }
  if (s.in_features == 0) {
    if (bias == nullptr) std::fill(y, y + s.tokens * s.out_features, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(s.tokens), blas_int(s.out_features),
              blas_int(s.in_features), 1.0f, x, blas_int(s.in_features), weight, blas_int(s.in_features), beta, y,
              blas_int(s.out_features));
}

void linear_backward_input(const LinearShape& s, const float* dy, const float* weight, float* dx) {
  if (s.tokens == 0 || s.in_features == 0) return;
  if (s.out_features == 0) {
    std::fill(dx, dx + s.tokens * s.in_features, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(s.tokens), blas_int(s.in_features),
              blas_int(s.out_features), 1.0f, dy, blas_int(s.out_features), weight, blas_int(s.in_features), 0.0f, dx,
              blas_int(s.in_features));
}

void linear_backward_weight(const LinearShape& s, const float* dy, const float* x, float* dweight, float* dbias) {
  if (s.tokens == 0 || s.out_features == 0) return;
  if (s.in_features > 0) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(s.out_features), blas_int(s.in_features),
                blas_int(s.tokens), 1.0f, dy, blas_int(s.out_features), x, blas_int(s.in_features), 1.0f, dweight,
                blas_int(s.in_features));
  }
  if (dbias != nullptr) {
    parallel_ranges(s.out_features, s.tokens, [&](std::int64_t b, std::int64_t e) {
      bias_grad_columns(b, e, s.tokens, s.out_features, dy, dbias);
    });
  }
}

void linear_backward(const LinearShape& s, const float* dy, const float* x, const float* weight, float* dx,
                     float* dweight, float* dbias) {
  linear_backward_input(s, dy, weight, dx);
  linear_backward_weight(s, dy, x, dweight, dbias);
}

}  // namespace dtrain::kernels::cpu
