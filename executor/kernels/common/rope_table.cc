#include <cmath>
#include <string>

#include "dtrain/common/error.h"
#include "dtrain/kernels/rope.h"

namespace dtrain::kernels {

void rope_table(double theta, std::int64_t seq, std::int64_t head_dim, float* cos, float* sin,
                const RopeScaling& scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    throw input_error("rope: head_dim = " + std::to_string(head_dim) + " must be positive and even");
  }
  if (seq < 0) throw input_error("rope: seq = " + std::to_string(seq) + " must not be negative");
  if (!(theta > 0.0)) throw input_error("rope: theta = " + std::to_string(theta) + " must be positive");
  const std::int64_t half = head_dim / 2;
  const double scale = scaling.attention_scale();
  for (std::int64_t i = 0; i < half; ++i) {
    const double inv_freq = scaling.frequency(i, head_dim, theta);
    for (std::int64_t p = 0; p < seq; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      cos[p * half + i] = static_cast<float>(scale * std::cos(angle));
      sin[p * half + i] = static_cast<float>(scale * std::sin(angle));
    }
  }
}

}  // namespace dtrain::kernels
