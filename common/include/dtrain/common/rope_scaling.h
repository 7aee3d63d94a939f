// Rotary-embedding frequency scaling as HuggingFace defines it (transformers' modeling_rope_utils), for pretrained
// models whose context was stretched: the model description holds it ([model.rope_scaling],
// dtrain/model/model_spec.h) and the kernels' cos/sin tables apply it (dtrain/kernels/rope.h). One rule, here, for
// both. Pair i of a head of size d has the frequency f_i = theta^(-2i/d) (radians per position); each kind scales it:
//
//   llama3 (Llama 3.1, 3.2; Meta's apply_scaling), with context C = original_max_position_embeddings and wavelength
//          w = 2 pi / f:  w > C / low_freq_factor (long): f / factor;  w < C / high_freq_factor (short): f;
//          between: (1 - s) f / factor + s f, s = (C / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
//   linear (position interpolation): f / factor
//   yarn   (Qwen2 long context, YaRN): the pairs below dimension `low` keep f, those above `high` take f / factor,
//          a linear ramp between, where a dimension's correction point is d ln(C / (beta 2 pi)) / (2 ln theta) for
//          beta = beta_fast (low) and beta_slow (high), rounded outward when truncate (HF's default) and clamped to
//          [0, d - 1]; cos and sin are then multiplied by the attention factor, 0.1 ln(factor) + 1 unless given.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace dtrain {

enum class RopeScalingType { kNone, kLlama3, kLinear, kYarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 0;
  double low_freq_factor = 1;      // llama3
  double high_freq_factor = 4;     // llama3
  double original_context = 8192;  // llama3, yarn: original_max_position_embeddings
  double beta_fast = 32;           // yarn
  double beta_slow = 1;            // yarn
  double attention_factor = 0;     // yarn: 0 for HF's default, 0.1 ln(factor) + 1
  bool truncate = true;            // yarn: the correction range rounded outward

  bool enabled() const { return type != RopeScalingType::kNone; }

  // HF's rope_type of this kind ("" for none).
  std::string_view name() const {
    switch (type) {
      case RopeScalingType::kLlama3:
        return "llama3";
      case RopeScalingType::kLinear:
        return "linear";
      case RopeScalingType::kYarn:
        return "yarn";
      case RopeScalingType::kNone:
        break;
    }
    return "";
  }

  // The scaled frequency f (radians per position) for the kinds that scale by frequency alone: none, linear,
  // llama3 (yarn's depends on the pair's dimension: frequency()).
  double scaled(double f) const {
    switch (type) {
      case RopeScalingType::kLinear:
        return f / factor;
      case RopeScalingType::kLlama3: {
        const double wavelength = 2 * std::numbers::pi / f;
        if (wavelength > original_context / low_freq_factor) return f / factor;
        if (wavelength < original_context / high_freq_factor) return f;
        const double s = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
        return (1 - s) * f / factor + s * f;
      }
      case RopeScalingType::kNone:
      case RopeScalingType::kYarn:
        break;
    }
    return f;
  }

  // The scaled frequency of pair i of a head of head_dim (theta: the base).
  double frequency(std::int64_t i, std::int64_t head_dim, double theta) const {
    const double d = static_cast<double>(head_dim);
    const double f = std::pow(theta, -2.0 * static_cast<double>(i) / d);
    switch (type) {
      case RopeScalingType::kNone:
      case RopeScalingType::kLinear:
      case RopeScalingType::kLlama3:
        return scaled(f);
      case RopeScalingType::kYarn: {
        const auto correction = [&](double beta) {
          return d * std::log(original_context / (beta * 2 * std::numbers::pi)) / (2 * std::log(theta));
        };
        double low = correction(beta_fast), high = correction(beta_slow);
        if (truncate) {
          low = std::floor(low);
          high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, d - 1);
        if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1.0 - ramp;  // the share of f kept
        return f / factor * (1 - extrapolation) + f * extrapolation;
      }
    }
    return f;
  }

  // What cos and sin are multiplied by: yarn's attention factor, 1 for the other kinds.
  double attention_scale() const {
    if (type != RopeScalingType::kYarn) return 1.0;
    if (attention_factor > 0) return attention_factor;
    return factor <= 1 ? 1.0 : 0.1 * std::log(factor) + 1.0;
  }
};

}  // namespace dtrain
