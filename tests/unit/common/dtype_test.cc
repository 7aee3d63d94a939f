// Element sizes: the one table (storage_bytes) and what the planner derives from it.
#include "dtrain/common/dtype.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "dtrain/common/bf16.h"

namespace dtrain {
namespace {

TEST(DType, StorageBytesAreTheElementSizes) {
  EXPECT_EQ(storage_bytes(DType::kFp32), static_cast<int>(sizeof(float)));
  EXPECT_EQ(storage_bytes(DType::kBf16), static_cast<int>(sizeof(bf16)));
  EXPECT_EQ(storage_bytes(DType::kFp16), 2);
  EXPECT_EQ(storage_bytes(DType::kFp8), 1);
  EXPECT_EQ(storage_bytes(DType::kUint8), static_cast<int>(sizeof(std::uint8_t)));
  EXPECT_EQ(storage_bytes(DType::kInt32), static_cast<int>(sizeof(std::int32_t)));
  EXPECT_EQ(storage_bytes(DType::kInt64), static_cast<int>(sizeof(std::int64_t)));
}

TEST(DType, Fp8KeepsActivationsInBf16AndGemmOperandsInOneByte) {
  EXPECT_EQ(activation_bytes(DType::kFp8), 2);
  EXPECT_EQ(gemm_operand_bytes(DType::kFp8), 1);
  for (DType d : {DType::kBf16, DType::kFp16, DType::kFp32, DType::kUint8, DType::kInt32, DType::kInt64}) {
    EXPECT_EQ(activation_bytes(d), storage_bytes(d)) << to_string(d);
    EXPECT_EQ(gemm_operand_bytes(d), storage_bytes(d)) << to_string(d);
  }
}

}  // namespace
}  // namespace dtrain
