// Internal: what the cuBLASLt GEMMs share (linear.cc, linear_fp8.cc): descriptor attributes, the heuristic's pick,
// pointer alignment.
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "cuda/context_impl.h"

namespace dtrain::kernels::cuda::detail {

// Largest power of two (at most 256, cuBLASLt's default assumption) that divides the address.
inline std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

template <class T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  DTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)));
}

struct PreferenceHolder {
  cublasLtMatmulPreference_t pref = nullptr;
  PreferenceHolder() = default;
  PreferenceHolder(const PreferenceHolder&) = delete;
  PreferenceHolder& operator=(const PreferenceHolder&) = delete;
  ~PreferenceHolder() {
    if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
  }
};

// The best algorithm cuBLASLt's heuristic offers for the plan (C and D alike), or false when it offers none.
inline bool pick_algorithm(Context::Impl& impl, const MatmulPlan& plan, cublasLtMatmulPreference_t pref,
                           cublasLtMatmulAlgo_t* algo) {
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(impl.lt, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &returned);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || returned == 0) return false;
  DTRAIN_CUBLAS_CHECK(s);
  if (result.state != CUBLAS_STATUS_SUCCESS) return false;
  *algo = result.algo;
  return true;
}

}  // namespace dtrain::kernels::cuda::detail
