// Internal: dropout scale factors (0 or 1 / (1 - p)) for a run of consecutive global element indices.
#pragma once

#include <cstdint>

#include "cpu/vec.h"
#include "dtrain/kernels/dropout.h"

namespace dtrain::kernels::cpu {

// scale[k] = (u(first + k) >= p) ? 1 / (1 - p) : 0 for k in [0, n), u as documented in dropout.h.
DTRAIN_INLINE void dropout_scales(const DropoutKey& key, std::uint64_t first, std::int64_t n, float p, float* scale) {
  const std::array<std::uint32_t, 2> k = {static_cast<std::uint32_t>(key.seed),
                                          static_cast<std::uint32_t>(key.seed >> 32)};
  const std::uint32_t c2 = static_cast<std::uint32_t>(key.step);
  const std::uint32_t c3 = (key.layer << 4) | static_cast<std::uint32_t>(key.site);
  const float keep_scale = 1.0f / (1.0f - p);
  std::int64_t i = 0;
  while (i < n) {
    const std::uint64_t e = first + static_cast<std::uint64_t>(i);
    const std::uint64_t q = e >> 2;
    const auto r = philox4x32_10({static_cast<std::uint32_t>(q), static_cast<std::uint32_t>(q >> 32), c2, c3}, k);
    for (unsigned w = static_cast<unsigned>(e & 3); w < 4 && i < n; ++w, ++i) {
      const float u = static_cast<float>(r[w] >> 8) * 0x1.0p-24f;
      scale[i] = u >= p ? keep_scale : 0.0f;
    }
  }
}

}  // namespace dtrain::kernels::cpu
