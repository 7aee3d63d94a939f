// Backend's type dispatch: which kernels serve an activation type.
#include "dtrain/exec/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dtrain/common/error.h"

namespace dtrain::exec {

void Backend::release(void* x, std::size_t bytes) {
  static const std::vector<std::uint8_t> zeros(std::size_t{1} << 20);
  auto* to = static_cast<std::uint8_t*>(x);
  for (std::size_t done = 0; done < bytes; done += zeros.size()) {
    copy_to_backend(to + done, zeros.data(), std::min(zeros.size(), bytes - done));
  }
}

bool Backend::supports(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return fp32_kernels() != nullptr;
    case DType::kBf16:
      return bf16_kernels() != nullptr;
    default:
      return false;
  }
}

namespace {
[[noreturn]] void no_kernels(const Backend& backend, DType dtype) {
  throw input_error(fmt::format("the {} backend has no kernels for {} activations", backend.name(), to_string(dtype)));
}
}  // namespace

template <>
Kernels<float>& Backend::kernels<float>() {
  Kernels<float>* k = fp32_kernels();
  if (k == nullptr) no_kernels(*this, DType::kFp32);
  return *k;
}

template <>
Kernels<bf16>& Backend::kernels<bf16>() {
  Kernels<bf16>* k = bf16_kernels();
  if (k == nullptr) no_kernels(*this, DType::kBf16);
  return *k;
}

}  // namespace dtrain::exec
