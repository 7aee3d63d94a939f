#include "dtrain/kernels/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/kernels/optimizer.h"

namespace dtrain::kernels {

void validate(const LrSchedule& s) {
  if (s.warmup_steps < 0 || s.decay_steps < 0) {
    throw input_error("lr schedule: warmup_steps = " + std::to_string(s.warmup_steps) +
                      " and decay_steps = " + std::to_string(s.decay_steps) + " must not be negative");
  }
  if (s.decay_steps < s.warmup_steps) {
    throw input_error("lr schedule: decay_steps = " + std::to_string(s.decay_steps) + " is less than warmup_steps = " +
                      std::to_string(s.warmup_steps) + " (decay_steps counts from step 0 and includes the warmup)");
  }
  if (s.min_lr < 0 || s.lr < s.min_lr) {
    throw input_error("lr schedule: need 0 <= min_lr <= lr, got lr = " + std::to_string(s.lr) +
                      ", min_lr = " + std::to_string(s.min_lr));
  }
}

double learning_rate(const LrSchedule& s, std::int64_t step) {
  if (step < 0) throw input_error("lr schedule: step " + std::to_string(step) + " is negative");
  if (step < s.warmup_steps) {
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  if (step >= s.decay_steps) return s.min_lr;
  const double progress =
      static_cast<double>(step - s.warmup_steps) / static_cast<double>(s.decay_steps - s.warmup_steps);
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coef = max_norm / (total_norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace dtrain::kernels
