#include "dtrain/common/dtype.h"

namespace dtrain {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kFp8:
      return "fp8";
    case DType::kFp32:
      return "fp32";
    case DType::kUint8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
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

bool is_integer(DType dtype) { return dtype == DType::kUint8 || dtype == DType::kInt32 || dtype == DType::kInt64; }

int storage_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
    case DType::kInt32:
      return 4;
    case DType::kBf16:
    case DType::kFp16:
      return 2;
    case DType::kFp8:
    case DType::kUint8:
      return 1;
    case DType::kInt64:
      return 8;
  }
  return 4;
}

int activation_bytes(DType dtype) { return storage_bytes(dtype == DType::kFp8 ? DType::kBf16 : dtype); }

int gemm_operand_bytes(DType dtype) { return storage_bytes(dtype); }

}  // namespace dtrain
