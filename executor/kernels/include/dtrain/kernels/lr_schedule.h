// Learning-rate schedule: linear warmup, then cosine decay to min_lr (GPT-3, Megatron's "cosine" style).
//
// step is the 0-based index of the optimizer step about to be taken (0 for the first step):
//   step <  warmup_steps:                lr(step) = lr * (step + 1) / warmup_steps
//   warmup_steps <= step < decay_steps:  progress = (step - warmup_steps) / (decay_steps - warmup_steps)
//                                        lr(step) = min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * progress))
//   step >= decay_steps:                 lr(step) = min_lr
// So the first step already trains (lr / warmup_steps), the peak lr is reached at step warmup_steps - 1 and again at
// step warmup_steps (progress 0), and the decay ends at min_lr at step decay_steps; decay_steps counts from step 0 and
// includes the warmup. warmup_steps = 0 starts the cosine at once. The fields are TrainingSpec's.
#pragma once

#include <cstdint>

namespace dtrain::kernels {

struct LrSchedule {
  double lr = 0;
  double min_lr = 0;
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 0;
};

// Throws dtrain::Error (input) for negative step counts, decay_steps < warmup_steps, or lr < min_lr < 0.
void validate(const LrSchedule& schedule);

// The learning rate of step `step` (see above). Throws dtrain::Error (input) when step < 0.
double learning_rate(const LrSchedule& schedule, std::int64_t step);

}  // namespace dtrain::kernels
