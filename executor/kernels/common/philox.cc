#include <string>

#include "dtrain/common/error.h"
#include "dtrain/kernels/dropout.h"

namespace dtrain::kernels {

void check_dropout_key(const DropoutKey& key) {
  if (key.step >= (std::uint64_t{1} << 32)) {
    throw input_error("dropout: step " + std::to_string(key.step) + " does not fit the 32-bit Philox counter word");
  }
  if (key.layer >= (std::uint32_t{1} << 28)) {
    throw input_error("dropout: layer " + std::to_string(key.layer) + " does not fit 28 bits of the Philox counter");
  }
}

float dropout_uniform(const DropoutKey& key, std::uint64_t element) {
  const std::uint64_t q = element >> 2;
  const auto r =
      philox4x32_10({static_cast<std::uint32_t>(q), static_cast<std::uint32_t>(q >> 32),
                     static_cast<std::uint32_t>(key.step), (key.layer << 4) | static_cast<std::uint32_t>(key.site)},
                    {static_cast<std::uint32_t>(key.seed), static_cast<std::uint32_t>(key.seed >> 32)});
  return static_cast<float>(r[element & 3] >> 8) * 0x1.0p-24f;
}

}  // namespace dtrain::kernels
