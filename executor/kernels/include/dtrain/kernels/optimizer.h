// AdamW (Loshchilov & Hutter 2019, decoupled weight decay), global gradient norm and clipping, over flat fp32
// buffers in multi-tensor style: one call updates a list of (param, grad, m, v, numel) buffers.
//
// The update of step t (t = 1 for the first step; bias corrections use it), the order of PyTorch's
// torch.optim.AdamW (single-tensor path), so that both give the same weights up to float rounding:
//   g      = grad * grad_scale                          (grad_scale = the clip coefficient, 1 without clipping)
//   param  = param * (1 - lr * weight_decay)            (only for buffers with decay = true)
//   m      = beta1 * m + (1 - beta1) * g
//   v      = beta2 * v + (1 - beta2) * g^2
//   param  = param - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Every operation is rounded to float on its own (no fused multiply-add), in this order, on both backends: one
// definition of the per-element update serves the CPU loop and the CUDA kernel (adamw_update.h), so the two give the
// same bits. lr comes from the schedule (lr_schedule.h); beta1, beta2, eps and weight_decay from TrainingSpec.
// Weight decay is not applied to norm weights and biases (GPT-2, Megatron and Llama practice): the caller sets
// decay = false for those buffers and true for the matrices (linear and embedding weights).
//
// Gradient clipping by global norm (Pascanu et al. 2013; torch.nn.utils.clip_grad_norm_):
//   1. grad_norm_squared: sum of squares of this rank's gradient buffers (float64, fixed order)
//   2. the caller all-reduces the sums over the ranks that hold distinct parameters (tensor and pipeline groups,
//      and the data-parallel group with a sharded optimizer), counting every parameter once: replicated parameters
//      (norm weights under tensor parallelism) must be counted on one rank only
//   3. clip_coefficient(sqrt(total), grad_clip) becomes the grad_scale of adamw_step.
#pragma once

#include <cstdint>

namespace dtrain::kernels {

struct AdamWConfig {
  double lr = 0;  // this step's learning rate
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0;
  std::int64_t step = 1;    // 1-based index of the step being taken
  double grad_scale = 1.0;  // multiplies every gradient (clip coefficient)
};

// One parameter tensor (or a contiguous flat bucket of several). m and v start at zero.
struct AdamWBuffer {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  std::int64_t numel = 0;
  bool decay = true;  // false for norm weights and biases
};

struct GradBuffer {
  const float* grad = nullptr;
  std::int64_t numel = 0;
};

// min(1, max_norm / (total_norm + 1e-6)), as torch.nn.utils.clip_grad_norm_; 1 when max_norm <= 0 (clipping off).
double clip_coefficient(double total_norm, double max_norm);

namespace cpu {

// Updates every buffer in place. Throws dtrain::Error (internal) when step < 1.
void adamw_step(const AdamWConfig& config, const AdamWBuffer* buffers, std::int64_t count);

// Sum over buffers of sum_i grad[i]^2, accumulated in float64, buffers in order, each in fixed-size blocks.
double grad_norm_squared(const GradBuffer* buffers, std::int64_t count);

// x[i] *= factor.
void scale(std::int64_t n, float factor, float* x);

}  // namespace cpu
}  // namespace dtrain::kernels
