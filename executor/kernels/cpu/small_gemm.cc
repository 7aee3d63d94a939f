#include "cpu/small_gemm.h"

#include <cstring>

#include "cpu/vec.h"

namespace dtrain::kernels::cpu {

namespace {

// 16 floats: one AVX-512 register, two AVX2 registers, four SSE registers (GCC lowers the operations per clone).
typedef float V16 __attribute__((vector_size(64)));

// Unaligned loads and stores (memcpy compiles to one vector move). No helper returns a V16 by value: that would be
// an ABI question (-Wpsabi) for the baseline clone.

// C[0:MR, 0:16*NV] block.
template <int MR, int NV>
DTRAIN_INLINE void micro_kernel(std::int64_t k, float alpha, const float* a, std::int64_t ars, std::int64_t acs,
                                const float* b, std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc) {
  V16 acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = V16{};
  }
  for (std::int64_t p = 0; p < k; ++p) {
    V16 bv[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + p * ldb + std::ptrdiff_t{16} * v, sizeof(V16));
    for (int r = 0; r < MR; ++r) {
      const float av = a[r * ars + p * acs];
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      float* dst = c + r * ldc + std::ptrdiff_t{16} * v;
      V16 out = alpha * acc[r][v];
      if (accumulate) {
        V16 old;
        std::memcpy(&old, dst, sizeof(V16));
        out += old;
      }
      std::memcpy(dst, &out, sizeof(V16));
    }
  }
}

// Rows [0, m) of a 16*NV-wide column panel: blocks of MR rows, then single rows.
template <int MR, int NV>
DTRAIN_INLINE void panel(std::int64_t m, std::int64_t k, float alpha, const float* a, std::int64_t ars,
                         std::int64_t acs, const float* b, std::int64_t ldb, bool accumulate, float* c,
                         std::int64_t ldc) {
  std::int64_t i = 0;
  for (; i + MR <= m; i += MR)
    micro_kernel<MR, NV>(k, alpha, a + i * ars, ars, acs, b, ldb, accumulate, c + i * ldc, ldc);
  for (; i < m; ++i) micro_kernel<1, NV>(k, alpha, a + i * ars, ars, acs, b, ldb, accumulate, c + i * ldc, ldc);
}

}  // namespace

DTRAIN_KERNEL_CLONES void small_gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                                     std::int64_t ars, std::int64_t acs, const float* b, std::int64_t ldb,
                                     bool accumulate, float* c, std::int64_t ldc) {
  std::int64_t j = 0;
  for (; j + 32 <= n; j += 32) panel<4, 2>(m, k, alpha, a, ars, acs, b + j, ldb, accumulate, c + j, ldc);
  for (; j + 16 <= n; j += 16) panel<6, 1>(m, k, alpha, a, ars, acs, b + j, ldb, accumulate, c + j, ldc);
  // Last n % 16 columns, same summation order as the vector panels.
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t jj = j; jj < n; ++jj) {
      float acc = 0.0f;
      for (std::int64_t p = 0; p < k; ++p) acc += a[i * ars + p * acs] * b[p * ldb + jj];
      float& dst = c[i * ldc + jj];
      dst = accumulate ? dst + alpha * acc : alpha * acc;
    }
  }
}

}  // namespace dtrain::kernels::cpu
