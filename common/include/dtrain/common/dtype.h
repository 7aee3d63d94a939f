// Numeric formats of training: what a tensor element costs in bytes and which peak rate a GEMM runs at.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dtrain {

enum class DType { kBf16, kFp16, kFp8, kFp32 };

std::string_view to_string(DType dtype);
std::optional<DType> parse_dtype(std::string_view text);
// Bytes of one activation/weight element in this format. fp8 training keeps activations in bf16 (transformer
// engine style: fp8 only inside the GEMMs), so it reports 2.
int activation_bytes(DType dtype);
// Bytes of one GEMM operand element (1 for fp8).
int gemm_operand_bytes(DType dtype);

}  // namespace dtrain
