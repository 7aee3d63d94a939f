#include "dtrain/kernels/cuda/linear.h"

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/check.h"
#include "cuda/context_impl.h"
#include "cuda/lt_util.h"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/elementwise.h"

namespace dtrain::kernels::cuda {

namespace detail {

MatmulPlan::~MatmulPlan() {
  // Destroy functions only fail for null descriptors; nothing to report.
  if (c != nullptr) (void)cublasLtMatrixLayoutDestroy(c);
  if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
  if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
  if (desc != nullptr) (void)cublasLtMatmulDescDestroy(desc);
}

}  // namespace detail

namespace {

using detail::alignment_of;
using detail::MatmulKey;
using detail::MatmulKind;
using detail::MatmulPlan;
using detail::pick_algorithm;
using detail::PreferenceHolder;
using detail::set_desc;
using detail::set_pref;

// One GEMM D = alpha op(A) op(B) + beta C (C = D) in cuBLASLt's column-major terms, with an optional bias epilogue.
struct Gemm {
  MatmulKind kind{};
  std::int64_t m = 0, n = 0, k = 0;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  std::int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;  // as stored (before op), leading dimension = rows
  cudaDataType_t c_type = CUDA_R_16BF;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;
  float beta = 0.0f;
};

const char* kind_name(MatmulKind kind) {
  switch (kind) {
    case MatmulKind::kForwardBf16:
      return "linear_forward (bf16 out)";
    case MatmulKind::kForwardFp32:
      return "linear_forward (fp32 out)";
    case MatmulKind::kBackwardInput:
      return "linear_backward_input";
    case MatmulKind::kBackwardWeight:
      return "linear_backward_weight";
    case MatmulKind::kFp8Bf16:
    case MatmulKind::kFp8Fp32:
      break;  // linear_fp8.cc's
  }
  return "linear";
}

MatmulPlan& plan_for(Context::Impl& impl, const Gemm& g) {
  const MatmulKey key{g.kind,
                      0,
                      g.m,
                      g.n,
                      g.k,
                      g.bias != nullptr,
                      alignment_of(g.a),
                      alignment_of(g.b),
                      alignment_of(g.c),
                      g.bias != nullptr ? alignment_of(g.bias) : 0u};
  if (auto it = impl.matmul_plans.find(key); it != impl.matmul_plans.end()) return *it->second;

  auto plan = std::make_unique<MatmulPlan>();
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(g.trans_a));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(g.trans_b));
  DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, static_cast<std::uint64_t>(g.a_rows),
                                                 static_cast<std::uint64_t>(g.a_cols), g.a_rows));
  DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, static_cast<std::uint64_t>(g.b_rows),
                                                 static_cast<std::uint64_t>(g.b_cols), g.b_rows));
  DTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, g.c_type, static_cast<std::uint64_t>(g.m),
                                                 static_cast<std::uint64_t>(g.n), g.m));

  PreferenceHolder holder;
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&holder.pref));
  set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(impl.workspace_bytes));
  set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
  set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
  set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_pref(holder.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);

  bool found = false;
  if (g.bias != nullptr) {
    // The heuristic reads the bias pointer's value (not its data) to know its alignment.
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(CUBLASLT_EPILOGUE_BIAS));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    found = pick_algorithm(impl, *plan, holder.pref, &plan->algo);
    plan->bias_in_epilogue = found;
    if (!found) {
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(CUBLASLT_EPILOGUE_DEFAULT));
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(nullptr));
    }
  }
  if (!found) found = pick_algorithm(impl, *plan, holder.pref, &plan->algo);
  if (!found) {
    throw internal_error(std::string("cuda: cuBLASLt offers no algorithm for ") + kind_name(g.kind) +
                         " with m = " + std::to_string(g.m) + ", n = " + std::to_string(g.n) +
                         ", k = " + std::to_string(g.k) + " (bf16 inputs, fp32 compute)");
  }
  return *impl.matmul_plans.emplace(key, std::move(plan)).first->second;
}

// Runs the GEMM; returns whether the bias (if any) was added by the epilogue.
bool run_gemm(Context& ctx, const Gemm& g) {
  Context::Impl& impl = ctx.impl();
  MatmulPlan& plan = plan_for(impl, g);
  if (plan.bias_in_epilogue) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  const float alpha = 1.0f;
  DTRAIN_CUBLAS_CHECK(cublasLtMatmul(impl.lt, plan.desc, &alpha, g.a, plan.a, g.b, plan.b, &g.beta, g.c, plan.c, g.c,
                                     plan.c, &plan.algo, impl.workspace, impl.workspace_bytes, impl.stream));
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, kind_name(g.kind));
  return plan.bias_in_epilogue;
}

void check_shape(const LinearShape& s) {
  DTRAIN_CHECK(s.tokens >= 0 && s.in_features >= 0 && s.out_features >= 0, "linear: negative dimension");
}

template <class Out, class Bias>
void forward(Context& ctx, const LinearShape& s, const bf16* x, const bf16* w, const Bias* bias, Out* y,
             MatmulKind kind, cudaDataType_t out_type) {
  check_shape(s);
  if (s.tokens == 0 || s.out_features == 0) return;
  if (s.in_features == 0) {  // an empty product: y = bias (or 0)
    fill(ctx, s.tokens * s.out_features, 0.0f, y);
    if (bias != nullptr) bias_add(ctx, s.tokens, s.out_features, bias, y);
    return;
  }
  Gemm g;
  g.kind = kind;
  g.m = s.out_features;
  g.n = s.tokens;
  g.k = s.in_features;
  g.trans_a = CUBLAS_OP_T;  // W stored [out, in] row-major = column-major in x out; op = T gives out x in
  g.a_rows = s.in_features;
  g.a_cols = s.out_features;
  g.b_rows = s.in_features;  // x stored [tokens, in] row-major = column-major in x tokens
  g.b_cols = s.tokens;
  g.c_type = out_type;
  g.a = w;
  g.b = x;
  g.c = y;
  g.bias = bias;
  const bool bias_added = run_gemm(ctx, g);
  if (bias != nullptr && !bias_added) bias_add(ctx, s.tokens, s.out_features, bias, y);
}

}  // namespace

void linear_forward(Context& ctx, const LinearShape& shape, const bf16* x, const bf16* weight, const bf16* bias,
                    bf16* y) {
  forward(ctx, shape, x, weight, bias, y, MatmulKind::kForwardBf16, CUDA_R_16BF);
}

void linear_forward(Context& ctx, const LinearShape& shape, const bf16* x, const bf16* weight, const float* bias,
                    float* y) {
  forward(ctx, shape, x, weight, bias, y, MatmulKind::kForwardFp32, CUDA_R_32F);
}

void linear_backward_input(Context& ctx, const LinearShape& s, const bf16* dy, const bf16* weight, bf16* dx) {
  check_shape(s);
  if (s.tokens == 0 || s.in_features == 0) return;
  if (s.out_features == 0) {
    fill(ctx, s.tokens * s.in_features, 0.0f, dx);
    return;
  }
  Gemm g;
  g.kind = MatmulKind::kBackwardInput;
  g.m = s.in_features;
  g.n = s.tokens;
  g.k = s.out_features;
  g.a_rows = s.in_features;  // W stored [out, in] row-major = column-major in x out, used as is
  g.a_cols = s.out_features;
  g.b_rows = s.out_features;  // dy stored [tokens, out] row-major = column-major out x tokens
  g.b_cols = s.tokens;
  g.c_type = CUDA_R_16BF;
  g.a = weight;
  g.b = dy;
  g.c = dx;
  (void)run_gemm(ctx, g);
}

void linear_backward_weight(Context& ctx, const LinearShape& s, const bf16* dy, const bf16* x, float* dweight,
                            float* dbias) {
  check_shape(s);
  if (s.tokens == 0 || s.out_features == 0) return;
  if (s.in_features > 0) {
    Gemm g;
    g.kind = MatmulKind::kBackwardWeight;
    g.m = s.in_features;
    g.n = s.out_features;
    g.k = s.tokens;
    g.trans_b = CUBLAS_OP_T;   // dy stored column-major out x tokens; op = T gives tokens x out
    g.a_rows = s.in_features;  // x stored column-major in x tokens
    g.a_cols = s.tokens;
    g.b_rows = s.out_features;
    g.b_cols = s.tokens;
    g.c_type = CUDA_R_32F;  // dW stored [out, in] row-major = column-major in x out
    g.a = x;
    g.b = dy;
    g.c = dweight;
    g.beta = 1.0f;  // accumulate into the fp32 gradient
    (void)run_gemm(ctx, g);
  }
  if (dbias != nullptr) bias_grad(ctx, s.tokens, s.out_features, dy, dbias);
}

void linear_backward(Context& ctx, const LinearShape& shape, const bf16* dy, const bf16* x, const bf16* weight,
                     bf16* dx, float* dweight, float* dbias) {
  linear_backward_input(ctx, shape, dy, weight, dx);
  linear_backward_weight(ctx, shape, dy, x, dweight, dbias);
}

}  // namespace dtrain::kernels::cuda
