// cuBLASLt's FP8 GEMMs (dtrain/kernels/cuda/fp8.h).
#include <fmt/format.h>

#include <cstdint>
#include <memory>

#include "cuda/check.h"
#include "cuda/context_impl.h"
#include "cuda/lt_util.h"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/fp8.h"

namespace dtrain::kernels::cuda {

namespace {

using detail::alignment_of;
using detail::MatmulKey;
using detail::MatmulKind;
using detail::MatmulPlan;

cudaDataType_t type_of(Fp8Kind kind) { return kind == Fp8Kind::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

// D (column-major m x n = row-major [n, m]) = alpha op(A) B (+ D), op(A) = A^T: cuBLASLt's "TN", the only layout of
// its FP8 GEMMs. A is stored column-major k x m (row-major [m, k]), B column-major k x n (row-major [n, k]).
void run(Context& ctx, std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a, const Fp8Operand& b,
         void* d, bool accumulate) {
  DTRAIN_CHECK(m >= 0 && n >= 0 && k >= 0, "fp8_gemm_tn: negative dimension");
  if (a.kind == Fp8Kind::kE5M2 && b.kind == Fp8Kind::kE5M2) {
    throw input_error("fp8_gemm_tn: cuBLASLt has no E5M2 x E5M2 GEMM (one operand must be E4M3)");
  }
  if (m % 16 != 0 || k % 16 != 0) {
    throw input_error(fmt::format(
        "an FP8 GEMM of m = {}, n = {}, k = {}: cuBLASLt's FP8 GEMMs need m and k (the layer's feature counts) to be "
        "multiples of 16; this model's layer widths do not allow [training] fp8 on the GPU",
        m, n, k));
  }
  if (m == 0 || n == 0) return;
  Context::Impl& impl = ctx.impl();
  const MatmulKind kind = accumulate ? MatmulKind::kFp8Fp32 : MatmulKind::kFp8Bf16;
  const MatmulKey key{kind,
                      2 * (a.kind == Fp8Kind::kE5M2 ? 1 : 0) + (b.kind == Fp8Kind::kE5M2 ? 1 : 0),
                      m,
                      n,
                      k,
                      false,
                      alignment_of(a.data),
                      alignment_of(b.data),
                      alignment_of(d),
                      0u};
  auto it = impl.matmul_plans.find(key);
  if (it == impl.matmul_plans.end()) {
    auto plan = std::make_unique<MatmulPlan>();
    const cudaDataType_t d_type = accumulate ? CUDA_R_32F : CUDA_R_16BF;
    DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    detail::set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(CUBLAS_OP_T));
    detail::set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(CUBLAS_OP_N));
    DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, type_of(a.kind), static_cast<std::uint64_t>(k),
                                                   static_cast<std::uint64_t>(m), k));
    DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, type_of(b.kind), static_cast<std::uint64_t>(k),
                                                   static_cast<std::uint64_t>(n), k));
    DTRAIN_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&plan->c, d_type, static_cast<std::uint64_t>(m), static_cast<std::uint64_t>(n), m));
    // The descales' pointers are set per call (run below); the heuristic needs them set to something.
    detail::set_desc(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.descale);
    detail::set_desc(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b.descale);
    detail::PreferenceHolder holder;
    DTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&holder.pref));
    detail::set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                     static_cast<std::uint64_t>(impl.workspace_bytes));
    detail::set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
    detail::set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
    detail::set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    detail::set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    if (!detail::pick_algorithm(impl, *plan, holder.pref, &plan->algo)) {
      throw internal_error(
          fmt::format("cuda: cuBLASLt offers no FP8 algorithm for m = {}, n = {}, k = {} ({} x {}, "
                      "{} out)",
                      m, n, k, a.kind == Fp8Kind::kE4M3 ? "E4M3" : "E5M2", b.kind == Fp8Kind::kE4M3 ? "E4M3" : "E5M2",
                      accumulate ? "fp32" : "bf16"));
    }
    it = impl.matmul_plans.emplace(key, std::move(plan)).first;
  }
  MatmulPlan& plan = *it->second;
  detail::set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.descale);
  detail::set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b.descale);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  DTRAIN_CUBLAS_CHECK(cublasLtMatmul(impl.lt, plan.desc, &alpha, a.data, plan.a, b.data, plan.b, &beta, d, plan.c, d,
                                     plan.c, &plan.algo, impl.workspace, impl.workspace_bytes, impl.stream));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, "fp8_gemm_tn");
}

}  // namespace

void fp8_gemm_tn(Context& ctx, std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a, const Fp8Operand& b,
                 bf16* d) {
  run(ctx, m, n, k, a, b, d, false);
}

void fp8_gemm_tn_accumulate(Context& ctx, std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                            const Fp8Operand& b, float* d) {
  run(ctx, m, n, k, a, b, d, true);
}

}  // namespace dtrain::kernels::cuda
