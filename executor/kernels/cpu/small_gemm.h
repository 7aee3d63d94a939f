// Internal: a register-blocked single-threaded GEMM for the small products inside attention tiles.
//
// Why not OpenBLAS here: the products are small (64 x 128 x head_dim) and many; OpenBLAS's per-call packing and
// thread dispatch cost as much as the arithmetic at these sizes, and calling a multi-threaded OpenBLAS from several
// pool workers at once oversubscribes the cores. This kernel is called from inside dtrain's own parallel loops. On
// the AVX-512 development machine it reaches about 200 GFLOP/s on one core for 64 x 128 x 64 in cache, where
// OpenBLAS 0.3.21 with OPENBLAS_CORETYPE=Haswell (as this environment sets it) reaches about 110.
#pragma once

#include <cstdint>

namespace dtrain::kernels::cpu {

// C = (accumulate ? C : 0) + alpha * A B, with
//   A (m x k): element (i, p) at a[i * a_row_stride + p * a_col_stride] (so a transposed operand is just strides)
//   B (k x n): row-major, element (p, j) at b[p * ldb + j]
//   C (m x n): row-major, element (i, j) at c[i * ldc + j]
// Each C element is summed over p in increasing order: the result does not depend on the ISA's vector width.
void small_gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t a_row_stride,
                std::int64_t a_col_stride, const float* b, std::int64_t ldb, bool accumulate, float* c,
                std::int64_t ldc);

}  // namespace dtrain::kernels::cpu
