// AdamW's update of one element: the one definition that the CPU loop (cpu/optimizer.cc) and the CUDA kernel
// (cuda/optimizer.cu) both call, so that the two backends give the same bits (the formula and its order:
// optimizer.h).
//
// Every operation is one IEEE single-precision operation rounded to nearest, in the formula's order; none may be fused
// into a multiply-add, which rounds once where the formula rounds twice:
//   - on the device, the _rn intrinsics (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn), which nvcc never
//     contracts (plain * and + it fuses by default, -fmad=true);
//   - on the host, plain operators, so the file that calls adamw_update must be compiled with -ffp-contract=off.
//     GCC contracts across statements by default, in ISO C++ mode too (-std=c++20 does not turn it off: only ISO
//     C does), and does so in the kernels' AVX2 and AVX-512 clones (cpu/vec.h), where FMA exists; the baseline clone
//     has no FMA. executor/kernels/CMakeLists.txt sets the flag on cpu/optimizer.cc, and the CPU optimizer test checks
//     the result against operations rounded one by one.
#pragma once

#include <cmath>

#include "dtrain/common/host_device.h"
#include "dtrain/kernels/optimizer.h"

namespace dtrain::kernels {

// The scalars of one adamw_step call (step t), computed on the host in float64 and rounded to float once.
struct AdamWScalars {
  float decay_factor;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float grad_scale;
};

// The scalars for `config` (host only). config.step must be >= 1 (the callers check it).
inline AdamWScalars adamw_scalars(const AdamWConfig& config) {
  const double t = static_cast<double>(config.step);
  return AdamWScalars{static_cast<float>(1.0 - config.lr * config.weight_decay),
                      static_cast<float>(config.beta1),
                      static_cast<float>(1.0 - config.beta1),
                      static_cast<float>(config.beta2),
                      static_cast<float>(1.0 - config.beta2),
                      static_cast<float>(config.lr / (1.0 - std::pow(config.beta1, t))),
                      static_cast<float>(std::sqrt(1.0 - std::pow(config.beta2, t))),
                      static_cast<float>(config.eps),
                      static_cast<float>(config.grad_scale)};
}

// One element after the update: the new parameter and moments.
struct AdamWElement {
  float param;
  float m;
  float v;
};

namespace adamw_detail {

// a * b, a + b, a - b, a / b, sqrt(a), each rounded to nearest on its own.
DTRAIN_HOST_DEVICE DTRAIN_FORCE_INLINE float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DTRAIN_HOST_DEVICE DTRAIN_FORCE_INLINE float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DTRAIN_HOST_DEVICE DTRAIN_FORCE_INLINE float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DTRAIN_HOST_DEVICE DTRAIN_FORCE_INLINE float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DTRAIN_HOST_DEVICE DTRAIN_FORCE_INLINE float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);  // IEEE square root: one instruction under -fno-math-errno, vectorisable
#endif
}

}  // namespace adamw_detail

// The update of one element with gradient `grad` (before grad_scale); decay: apply weight decay (false for norm
// weights and biases). Pure: reads its arguments, returns the new values.
DTRAIN_HOST_DEVICE DTRAIN_FORCE_INLINE AdamWElement adamw_update(const AdamWScalars& c, bool decay, float param,
                                                                 float grad, float m, float v) {
  namespace op = adamw_detail;
  const float g = op::mul(grad, c.grad_scale);
  const float p = decay ? op::mul(param, c.decay_factor) : param;
  const float mi = op::add(op::mul(m, c.beta1), op::mul(g, c.one_minus_beta1));
  const float vi = op::add(op::mul(v, c.beta2), op::mul(op::mul(c.one_minus_beta2, g), g));  // addcmul: (value*g)*g
  const float denom = op::add(op::div(op::sqrt(vi), c.bias_correction2_sqrt), c.eps);
  return AdamWElement{op::sub(p, op::mul(c.step_size, op::div(mi, denom))), mi, vi};
}

}  // namespace dtrain::kernels
