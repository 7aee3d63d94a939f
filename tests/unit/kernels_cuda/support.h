// Shared by the CUDA kernel tests: the fixture that skips without a GPU, host <-> device copies, bf16 vectors and the
// error measure.
//
// How the GPU is compared with the CPU backend: inputs are drawn in fp32, rounded to bf16 (round_bf16), and the CPU
// kernel gets the rounded values as floats while the GPU gets the same values as bf16. Both then compute in fp32, so
// what remains is the GPU rounding its bf16 outputs once (unit roundoff 2^-8 = 3.9e-3) plus fp32 summation-order
// differences (about 1e-7 per term). The tolerances below are stated for those two cases.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda::testing {

using FVec = std::vector<float>;
using BVec = std::vector<bf16>;
using IVec = std::vector<std::int32_t>;

// Relative 2-norm error of a bf16 output against the fp32 CPU result: each element is within 2^-8 relative of the
// exact value after one rounding, so the norm is about 2^-9; 1e-2 leaves room for a few elements rounded twice
// (a bf16 intermediate the CPU keeps in fp32) and nothing more: a wrong mask, index or formula gives 1e-1 and above.
inline constexpr double kBf16Tolerance = 1e-2;
// fp32 outputs computed from identical inputs in a different summation order (hundreds of terms at 6e-8 each).
inline constexpr double kFp32Tolerance = 1e-5;

// Skips the test with "no CUDA device: <reason>" when no usable GPU is present; otherwise gives it a Context.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override;
  Context& ctx() { return *ctx_; }

 private:
  std::unique_ptr<Context> ctx_;
};

std::mt19937_64 make_rng(std::uint64_t seed);
// n samples of N(0, stddev^2) rounded to bf16 (and held as floats): exactly representable in both backends.
FVec random_bf16_values(std::mt19937_64& rng, std::size_t n, double stddev = 1.0);
FVec random_floats(std::mt19937_64& rng, std::size_t n, double stddev = 1.0);
IVec random_ids(std::mt19937_64& rng, std::size_t n, std::int32_t vocab);

BVec to_bf16_vec(const FVec& x);    // each element rounded to nearest bf16
FVec from_bf16_vec(const BVec& x);  // exact
FVec round_bf16(const FVec& x);     // from_bf16_vec(to_bf16_vec(x))

// ||out - ref|| / ||ref|| (||out - ref|| when ref is 0).
double rel_error(const FVec& out, const FVec& ref);

template <class T>
DeviceBuffer<T> to_device(Context& ctx, const std::vector<T>& host) {
  DeviceBuffer<T> d = allocate<T>(ctx, host.size());
  copy_to_device(ctx, d.data(), host.data(), host.size() * sizeof(T));
  return d;
}

// A device buffer holding x rounded to bf16.
inline DeviceBuffer<bf16> to_device_bf16(Context& ctx, const FVec& x) { return to_device(ctx, to_bf16_vec(x)); }

template <class T>
std::vector<T> to_host(Context& ctx, const DeviceBuffer<T>& d) {
  std::vector<T> host(d.size());
  copy_to_host(ctx, host.data(), d.data(), d.bytes());
  return host;
}

inline FVec to_host_float(Context& ctx, const DeviceBuffer<bf16>& d) { return from_bf16_vec(to_host(ctx, d)); }

// A device buffer of n elements filled with NaNs (0xff bytes): an output the kernel must overwrite.
template <class T>
DeviceBuffer<T> poisoned(Context& ctx, std::size_t n) {
  DeviceBuffer<T> d = allocate<T>(ctx, n);
  memset_device(ctx, d.data(), 0xff, d.bytes());
  return d;
}

}  // namespace dtrain::kernels::cuda::testing
