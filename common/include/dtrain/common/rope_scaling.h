// Llama 3's rotary-embedding frequency scaling (HuggingFace rope_type "llama3", Meta's apply_scaling): the model
// description holds it ([model.rope_scaling], dtrain/model/model_spec.h) and the kernels' cos/sin tables apply it
// (dtrain/kernels/rope.h). One rule, here, for both.
//
// With context C = original_max_position_embeddings, a frequency f (radians per position) has wavelength 2 pi / f:
//   wavelength > C / low_freq_factor (long):   f / factor
//   wavelength < C / high_freq_factor (short): f
//   between:  (1 - s) f / factor + s f,  s = (C / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
#pragma once

#include <numbers>

namespace dtrain {

struct RopeScaling {
  double factor = 0;  // 0: no scaling
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  double original_context = 8192;  // original_max_position_embeddings

  bool enabled() const { return factor > 0; }
  // The scaled frequency of `inv_freq` (radians per position).
  double scaled(double inv_freq) const {
    if (!enabled()) return inv_freq;
    const double wavelength = 2 * std::numbers::pi / inv_freq;
    if (wavelength > original_context / low_freq_factor) return inv_freq / factor;
    if (wavelength < original_context / high_freq_factor) return inv_freq;
    const double s = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (1 - s) * inv_freq / factor + s * inv_freq;
  }
};

}  // namespace dtrain
