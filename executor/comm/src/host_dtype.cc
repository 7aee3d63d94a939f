#include "src/host_dtype.h"

#include <cstring>

namespace dtrain::comm::detail {

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

std::uint16_t float_to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the sign and the top of the payload, and set the quiet bit so that truncation cannot make it inf.
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest, ties to even: add just under half of the dropped part's unit, plus the kept part's lowest bit.
  // A carry out of the mantissa correctly bumps the exponent (and the largest values up to infinity).
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

std::vector<float> widen_bf16(const void* in, std::size_t count) {
  std::vector<float> out(count);
  const auto* bytes = static_cast<const unsigned char*>(in);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, bytes + 2 * i, sizeof bits);
    out[i] = bf16_to_float(bits);
  }
  return out;
}

void narrow_to_bf16(const float* in, std::size_t count, void* out) {
  auto* bytes = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint16_t bits = float_to_bf16(in[i]);
    std::memcpy(bytes + 2 * i, &bits, sizeof bits);
  }
}

}  // namespace dtrain::comm::detail
