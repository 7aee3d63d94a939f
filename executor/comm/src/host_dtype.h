// Element types on the host backends (inproc, Gloo), private to dtrain::comm: bf16 conversions, the adapter that
// computes a bf16 reduction in fp32, and integer reductions (exact in their own type).
//
// Why fp32: a bf16 sum rounded after every addition loses up to 8 bits over a few ranks and depends on the order of
// the additions; widening the inputs, reducing in fp32 in the backend's fixed order and rounding once keeps the
// result within one bf16 rounding of the exact fp32 reduction, and bitwise equal on every rank (every rank rounds the
// same fp32 value). It costs a temporary fp32 copy of the buffers, which the host backends (tests, CPU runs) can
// afford.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "dtrain/common/error.h"

namespace dtrain::comm::detail {

// in: `count` bf16 values; returns them as fp32 (exact).
std::vector<float> widen_bf16(const void* in, std::size_t count);
// Rounds `count` fp32 values into `count` bf16 values at out, as dtrain::to_bf16 (dtrain/common/bf16.h) does and so
// as the kernels do: nearest, ties to even; overflow to infinity; a NaN becomes the quiet NaN with its sign.
void narrow_to_bf16(const float* in, std::size_t count, void* out);

// Runs reduce(const float* send, float* recv), the backend's fp32 reduction, for buffers of `dtype`: fp32 buffers
// are passed through as they are (in place stays in place); bf16 buffers are widened into a temporary fp32 copy of
// send (send_count elements), reduced into a temporary fp32 recv (recv_count elements) and rounded into recv. The
// copy is taken before anything is written, so send and recv may share memory.
template <typename Reduce>
void reduce_in_fp32(const void* send, std::size_t send_count, void* recv, std::size_t recv_count, DType dtype,
                    Reduce&& reduce) {
  if (dtype == DType::kFp32) {
    reduce(static_cast<const float*>(send), static_cast<float*>(recv));
    return;
  }
  DTRAIN_CHECK(dtype == DType::kBf16, "host backends reduce fp32 and bf16 only");
  const std::vector<float> wide_send = widen_bf16(send, send_count);
  std::vector<float> wide_recv(recv_count);
  reduce(wide_send.data(), wide_recv.data());
  narrow_to_bf16(wide_recv.data(), recv_count, recv);
}

// fp32, bf16 and the integer types: what the host backends support.
inline bool host_supports(DType dtype) { return dtype == DType::kFp32 || dtype == DType::kBf16 || is_integer(dtype); }

// Calls fn(T{}) with T the C++ type of an integer dtype (std::uint8_t, std::int32_t, std::int64_t).
template <typename Fn>
void with_integer_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kUint8:
      fn(std::uint8_t{});
      return;
    case DType::kInt32:
      fn(std::int32_t{});
      return;
    case DType::kInt64:
      fn(std::int64_t{});
      return;
    default:
      break;
  }
  DTRAIN_CHECK(false, "not an integer dtype");
}

// out[i] = a[i] op b[i] for i < n, integers. Sums wrap modulo 2^bits (computed unsigned, where overflow is defined),
// as NCCL's integer sums do. out may be a or b.
template <typename T>
void reduce_integers(ReduceOp op, const T* a, const T* b, T* out, std::size_t n) {
  using U = std::make_unsigned_t<T>;
  if (op == ReduceOp::kSum) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<U>(static_cast<U>(a[i]) + b[i]));
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
  }
}

}  // namespace dtrain::comm::detail
