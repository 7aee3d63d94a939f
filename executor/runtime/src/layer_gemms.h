// The GEMMs of the transformer layers' linear layers (attention projections, MLPs, shared and routed experts): what
// the interpreter calls for them, so that [training] fp8 changes these and nothing else (the output layer goes through
// plain_gemms, the router and the shared experts' gate to Kernels<A> directly: Transformer Engine leaves them in bf16).
//
// plain_gemms passes every call to the backend's kernels. fp8_gemms (fp8_gemms.cc) on host-memory backends rounds
// each GEMM's operands to FP8 under per-tensor power-of-two scales (dtrain/kernels/fp8.h) and multiplies the
// dequantised values with the backend's kernels, fp32 accumulation: the FP8 GEMM's result exactly (see fp8.h). The
// forward pass's operands (input, weight) are E4M3; the backward's output gradient E5M2 under "hybrid", E4M3 under
// "e4m3". Bias gradients are taken from the unrounded output gradient, as Transformer Engine's fused casts do. On the
// CUDA backend (cuda_fp8_gemms.cc) the same casts and scales feed cuBLASLt's FP8 GEMMs.
//
// A tensor's scale (kernels::fp8_scale of an amax): tensorwise, its own amax at the call; delayed, the largest amax
// that tensor (role and layer: a linear layer's input, weight or output gradient) had in the previous training step,
// or in its first step its own. Within a step the scales are fixed, so the weight gradient's input is rounded as the
// forward pass rounded it. Evaluation passes use the scales and record nothing (set_recording). Amaxes are this
// rank's: a tensor-parallel shard is scaled by its own amax (Transformer Engine reduces them over the group), so
// layouts differ slightly under FP8, and a resumed delayed run starts its history afresh (the first step after the
// resume scales like tensorwise).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "dtrain/exec/backend.h"
#include "dtrain/kernels/fp8.h"
#include "dtrain/model/model_spec.h"

namespace dtrain::kernels::cuda {
class Context;
}

namespace dtrain::exec::detail {

template <typename A>
class LayerGemms {
 public:
  virtual ~LayerGemms() = default;
  // Kernels<A>::linear_* and grouped_linear_*'s arguments and semantics.
  virtual void forward(const kernels::LinearShape& shape, const A* x, const A* weight, const A* bias, A* y) = 0;
  virtual void backward_input(const kernels::LinearShape& shape, const A* dy, const A* weight, A* dx) = 0;
  virtual void backward_weight(const kernels::LinearShape& shape, const A* dy, const A* x, float* dweight,
                               float* dbias) = 0;
  virtual void grouped_forward(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                               const A* x, const A* const* weights, A* y) = 0;
  virtual void grouped_backward_input(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                                      const A* dy, const A* const* weights, A* dx) = 0;
  virtual void grouped_backward_weight(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                                       const A* dy, const A* x, float* const* dweights) = 0;
  // At the start of every training step (before its first pass).
  virtual void begin_step() {}
  // Whether amaxes are recorded for the next step's scales (false during evaluation).
  virtual void set_recording(bool on) { (void)on; }
};

// A LayerGemms whose grouped calls run one GEMM per non-empty group through forward and backward_* (the FP8 ones:
// each expert's operands get their own scales, as Transformer Engine's grouped linear layer gives them).
template <typename A>
class PerGroupGemms : public LayerGemms<A> {
 public:
  void grouped_forward(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out, const A* x,
                       const A* const* w, A* y) override {
    for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
      if (rows[g] > 0) this->forward({rows[g], in, out}, x + r * in, w[g], nullptr, y + r * out);
    }
  }
  void grouped_backward_input(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                              const A* dy, const A* const* w, A* dx) override {
    for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
      if (rows[g] > 0) this->backward_input({rows[g], in, out}, dy + r * out, w[g], dx + r * in);
    }
  }
  void grouped_backward_weight(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                               const A* dy, const A* x, float* const* dw) override {
    for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
      if (rows[g] > 0) this->backward_weight({rows[g], in, out}, dy + r * out, x + r * in, dw[g], nullptr);
    }
  }
};

template <typename A>
std::unique_ptr<LayerGemms<A>> plain_gemms(Kernels<A>& kernels);

// The three tensors an FP8 GEMM site (a linear layer, or one expert) casts, and what a recipe casts each to.
enum Fp8Role { kFp8Input = 0, kFp8Weight = 1, kFp8Gradient = 2 };
struct Fp8Casts {
  explicit Fp8Casts(const model::TrainingSpec& t)
      : delayed(t.fp8_recipe == model::Fp8Recipe::kDelayed),
        gradient(t.fp8 == model::Fp8Format::kHybrid ? kernels::Fp8Kind::kE5M2 : kernels::Fp8Kind::kE4M3) {}
  kernels::Fp8Kind kind(Fp8Role role) const { return role == kFp8Gradient ? gradient : kernels::Fp8Kind::kE4M3; }
  bool delayed;               // scales from the previous step's amaxes (else the tensor's own)
  kernels::Fp8Kind gradient;  // E5M2 under "hybrid", E4M3 under "e4m3"
};

// Where a weight (a pointer into the weights the passes read) or a weight gradient (into the gradients) sits in the
// flat parameter buffer: the element offset both share, which names the linear layer.
struct ParameterSites {
  std::function<std::int64_t(const void* weight)> of_weight;
  std::function<std::int64_t(const float* gradient)> of_gradient;
};

// The emulation on a host-memory backend, cuBLASLt's FP8 GEMMs on the CUDA backend (bf16 activations). Throws
// dtrain::Error (input) for any other.
template <typename A>
std::unique_ptr<LayerGemms<A>> fp8_gemms(Backend& backend, Kernels<A>& kernels, const model::TrainingSpec& training,
                                         ParameterSites sites);

// The CUDA backend's context, nullptr for any other backend (cuda_backend.cc; no_cuda_backend.cc: always nullptr).
kernels::cuda::Context* cuda_context(Backend& backend);
// The CUDA backend's FP8 GEMMs (cuda_fp8_gemms.cc; without CUDA, no_cuda_backend.cc throws).
std::unique_ptr<LayerGemms<bf16>> cuda_fp8_gemms(kernels::cuda::Context& ctx, Kernels<bf16>& kernels,
                                                 const model::TrainingSpec& training, ParameterSites sites);

}  // namespace dtrain::exec::detail
