#include "dtrain/common/dtype.h"

namespace dtrain {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::kBf16: return "bf16";
    case DType::kFp16: return "fp16";
    case DType::kFp8: return "fp8";
    case DType::kFp32: return "fp32";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view text) {
  if (text == "bf16") return DType::kBf16;
  if (text == "fp16") return DType::kFp16;
  if (text == "fp8") return DType::kFp8;
  if (text == "fp32") return DType::kFp32;
  return std::nullopt;
}

int activation_bytes(DType dtype) { return dtype == DType::kFp32 ? 4 : 2; }

int gemm_operand_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFp8: return 1;
    case DType::kFp32: return 4;
    default: return 2;
  }
}

}  // namespace dtrain
