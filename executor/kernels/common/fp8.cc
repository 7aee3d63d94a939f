// FP8 rounding and scales (dtrain/kernels/fp8.h).
#include "dtrain/kernels/fp8.h"

#include <algorithm>
#include <cmath>

namespace dtrain::kernels {

float fp8_scale(float amax, Fp8Kind kind) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  const float ratio = fp8_max(kind) / amax;
  if (!std::isfinite(ratio)) return std::ldexp(1.0f, 126);  // amax below 2^-119: the largest useful power
  int exponent = 0;
  std::frexp(ratio, &exponent);  // ratio in [2^(exponent-1), 2^exponent)
  return std::ldexp(1.0f, std::clamp(exponent - 1, -126, 126));
}

}  // namespace dtrain::kernels
