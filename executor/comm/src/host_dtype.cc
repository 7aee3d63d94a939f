#include "src/host_dtype.h"

#include <cstring>

#include "dtrain/common/bf16.h"

namespace dtrain::comm::detail {

// Buffers are untyped (const void*) and need not be aligned for bf16: elements are copied in and out with memcpy.

std::vector<float> widen_bf16(const void* in, std::size_t count) {
  std::vector<float> out(count);
  const auto* bytes = static_cast<const unsigned char*>(in);
  for (std::size_t i = 0; i < count; ++i) {
    bf16 x;
    std::memcpy(&x, bytes + sizeof(bf16) * i, sizeof x);
    out[i] = from_bf16(x);
  }
  return out;
}

void narrow_to_bf16(const float* in, std::size_t count, void* out) {
  auto* bytes = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < count; ++i) {
    const bf16 x = to_bf16(in[i]);
    std::memcpy(bytes + sizeof(bf16) * i, &x, sizeof x);
  }
}

}  // namespace dtrain::comm::detail
