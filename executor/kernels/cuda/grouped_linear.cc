#include "dtrain/kernels/cuda/grouped_linear.h"

#include <cublas_v2.h>

#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/context_impl.h"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/linear.h"

namespace dtrain::kernels::cuda {

namespace {

// The context's cuBLAS handle (made on first use, on the context's stream).
cublasHandle_t blas(Context& ctx) {
  Context::Impl& impl = ctx.impl();
  if (impl.blas == nullptr) {
    DTRAIN_CUBLAS_CHECK(cublasCreate(&impl.blas));
    DTRAIN_CUBLAS_CHECK(cublasSetStream(impl.blas, impl.stream));
    DTRAIN_CUBLAS_CHECK(cublasSetWorkspace(impl.blas, impl.workspace, impl.workspace_bytes));
  }
  return impl.blas;
}

// One problem per non-empty group, in cuBLAS's column-major terms (see linear.cc for the mapping of the row-major
// tensors): C (m x n) = op(A) (m x k) op(B) (k x n) + beta C.
struct Problems {
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<float> alpha, beta;
  std::vector<const void*> a, b;
  std::vector<void*> c;
  void add(cublasOperation_t op_a, cublasOperation_t op_b, std::int64_t mm, std::int64_t nn, std::int64_t kk,
           const void* pa, std::int64_t la, const void* pb, std::int64_t lb, void* pc, std::int64_t lc, float bt) {
    ta.push_back(op_a);
    tb.push_back(op_b);
    m.push_back(static_cast<int>(mm));
    n.push_back(static_cast<int>(nn));
    k.push_back(static_cast<int>(kk));
    lda.push_back(static_cast<int>(la));
    ldb.push_back(static_cast<int>(lb));
    ldc.push_back(static_cast<int>(lc));
    size.push_back(1);
    alpha.push_back(1.0f);
    beta.push_back(bt);
    a.push_back(pa);
    b.push_back(pb);
    c.push_back(pc);
  }
};

// Runs the problems as one grouped GEMM; false when cuBLAS has no kernel for them (the caller runs them one by one).
bool run_grouped(Context& ctx, const Problems& p, cudaDataType_t c_type, const char* what) {
  if (p.m.empty()) return true;
  for (std::size_t i = 0; i < p.m.size(); ++i) {
    DTRAIN_CHECK(p.m[i] > 0 && p.n[i] > 0 && p.k[i] > 0, std::string(what) + ": a dimension above 2^31 or empty");
  }
  const auto count = p.m.size();
  DeviceBuffer<const void*> a = allocate<const void*>(ctx, count), b = allocate<const void*>(ctx, count);
  DeviceBuffer<void*> c = allocate<void*>(ctx, count);
  copy_to_device(ctx, a.data(), p.a.data(), count * sizeof(void*));
  copy_to_device(ctx, b.data(), p.b.data(), count * sizeof(void*));
  copy_to_device(ctx, c.data(), p.c.data(), count * sizeof(void*));
  const cublasStatus_t s = cublasGemmGroupedBatchedEx(
      blas(ctx), p.ta.data(), p.tb.data(), p.m.data(), p.n.data(), p.k.data(), p.alpha.data(), a.data(), CUDA_R_16BF,
      p.lda.data(), b.data(), CUDA_R_16BF, p.ldb.data(), p.beta.data(), c.data(), c_type, p.ldc.data(),
      static_cast<int>(count), p.size.data(), CUBLAS_COMPUTE_32F);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
    ++ctx.impl().grouped_fallbacks;
    return false;
  }
  DTRAIN_CUBLAS_CHECK(s);
  DTRAIN_CUDA_CHECK_LAUNCH(ctx, what);
  return true;
}

}  // namespace

std::int64_t grouped_linear_fallbacks(Context& ctx) { return ctx.impl().grouped_fallbacks; }

void grouped_linear_forward(Context& ctx, std::int64_t groups, const std::int64_t* rows, std::int64_t in,
                            std::int64_t out, const bf16* x, const bf16* const* weights, bf16* y) {
  Problems p;
  for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
    if (rows[g] == 0) continue;
    // y^T (out x rows) = W (op T of the column-major in x out) . x^T (in x rows).
    p.add(CUBLAS_OP_T, CUBLAS_OP_N, out, rows[g], in, weights[g], in, x + r * in, in, y + r * out, out, 0.0f);
  }
  if (run_grouped(ctx, p, CUDA_R_16BF, "grouped_linear_forward")) return;
  for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
    if (rows[g] > 0) linear_forward(ctx, {rows[g], in, out}, x + r * in, weights[g], nullptr, y + r * out);
  }
}

void grouped_linear_backward_input(Context& ctx, std::int64_t groups, const std::int64_t* rows, std::int64_t in,
                                   std::int64_t out, const bf16* dy, const bf16* const* weights, bf16* dx) {
  Problems p;
  for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
    if (rows[g] == 0) continue;
    // dx^T (in x rows) = W^T (the column-major in x out as is) . dy^T (out x rows).
    p.add(CUBLAS_OP_N, CUBLAS_OP_N, in, rows[g], out, weights[g], in, dy + r * out, out, dx + r * in, in, 0.0f);
  }
  if (run_grouped(ctx, p, CUDA_R_16BF, "grouped_linear_backward_input")) return;
  for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
    if (rows[g] > 0) linear_backward_input(ctx, {rows[g], in, out}, dy + r * out, weights[g], dx + r * in);
  }
}

void grouped_linear_backward_weight(Context& ctx, std::int64_t groups, const std::int64_t* rows, std::int64_t in,
                                    std::int64_t out, const bf16* dy, const bf16* x, float* const* dweights) {
  Problems p;
  for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
    if (rows[g] == 0) continue;
    // dW^T (in x out, the column-major view of [out, in]) += x^T (in x rows) . dy (rows x out: op T of out x rows).
    p.add(CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows[g], x + r * in, in, dy + r * out, out, dweights[g], in, 1.0f);
  }
  if (run_grouped(ctx, p, CUDA_R_32F, "grouped_linear_backward_weight")) return;
  for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
    if (rows[g] > 0) linear_backward_weight(ctx, {rows[g], in, out}, dy + r * out, x + r * in, dweights[g], nullptr);
  }
}

}  // namespace dtrain::kernels::cuda
