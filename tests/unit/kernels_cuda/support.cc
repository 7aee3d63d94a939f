#include "support.h"

#include <cmath>
#include <string>

namespace dtrain::kernels::cuda::testing {

void CudaTest::SetUp() {
  const std::string reason = device_unavailable_reason(0);
  if (!reason.empty()) GTEST_SKIP() << reason;
  ctx_ = std::make_unique<Context>(ContextOptions{});
}

std::mt19937_64 make_rng(std::uint64_t seed) { return std::mt19937_64(seed); }

FVec random_floats(std::mt19937_64& rng, std::size_t n, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  FVec x(n);
  for (float& v : x) v = static_cast<float>(dist(rng));
  return x;
}

FVec random_bf16_values(std::mt19937_64& rng, std::size_t n, double stddev) {
  return round_bf16(random_floats(rng, n, stddev));
}

IVec random_ids(std::mt19937_64& rng, std::size_t n, std::int32_t vocab) {
  std::uniform_int_distribution<std::int32_t> dist(0, vocab - 1);
  IVec ids(n);
  for (auto& id : ids) id = dist(rng);
  return ids;
}

BVec to_bf16_vec(const FVec& x) {
  BVec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = to_bf16(x[i]);
  return y;
}

FVec from_bf16_vec(const BVec& x) {
  FVec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = from_bf16(x[i]);
  return y;
}

FVec round_bf16(const FVec& x) { return from_bf16_vec(to_bf16_vec(x)); }

double rel_error(const FVec& out, const FVec& ref) {
  EXPECT_EQ(out.size(), ref.size());
  double diff = 0.0;
  double norm = 0.0;
  for (std::size_t i = 0; i < out.size() && i < ref.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    diff += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  // A NaN anywhere (an element the kernel never wrote keeps the poison) makes the error NaN, which fails every
  // EXPECT_LT.
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace dtrain::kernels::cuda::testing
