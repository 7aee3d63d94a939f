// Element types: the numeric formats of training (bf16, fp16, fp8, fp32: what a tensor element costs in bytes and
// which peak rate a GEMM runs at), and the integer types that only communication moves (uint8 for bytes such as
// strings, int32 and int64 for counts, steps and flags; see dtrain/comm/communicator.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dtrain {

enum class DType { kBf16, kFp16, kFp8, kFp32, kUint8, kInt32, kInt64 };

// "bf16", ..., "uint8", "int32", "int64".
std::string_view to_string(DType dtype);
// A training format by name (bf16, fp16, fp8, fp32); nullopt for anything else, the integer types included: no
// model, plan or program names those.
std::optional<DType> parse_dtype(std::string_view text);
// Whether dtype is one of the integer types (uint8, int32, int64).
bool is_integer(DType dtype);
// Bytes one element of `dtype` takes in memory, in a file and on the wire: 4 for fp32 and int32, 2 for bf16 and
// fp16, 1 for fp8 and uint8, 8 for int64. The one table of element sizes; the functions below and the communicators'
// buffers (dtrain/comm/communicator.h) are sized from it.
int storage_bytes(DType dtype);
// Bytes of one activation/weight element in this format. fp8 training keeps activations in bf16 (transformer
// engine style: fp8 only inside the GEMMs), so it reports 2. The integer types report their size.
int activation_bytes(DType dtype);
// Bytes of one GEMM operand element (1 for fp8; the integer types: their size).
int gemm_operand_bytes(DType dtype);

}  // namespace dtrain
