#include "dtrain/kernels/cuda/random.h"

#include <algorithm>
#include <random>
#include <vector>

#include "dtrain/kernels/cuda/elementwise.h"

namespace dtrain::kernels::cuda {

DeviceBuffer<float> random_normal_fp32(Context& ctx, std::int64_t n, float stddev, std::uint64_t seed) {
  constexpr std::int64_t kChunk = std::int64_t{1} << 22;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> host(static_cast<std::size_t>(std::min(n, kChunk)));
  for (float& x : host) x = dist(rng);
  DeviceBuffer<float> d = allocate<float>(ctx, static_cast<std::size_t>(n));
  for (std::int64_t first = 0; first < n; first += kChunk) {
    const std::int64_t count = std::min(kChunk, n - first);
    copy_to_device(ctx, d.data() + first, host.data(), static_cast<std::size_t>(count) * sizeof(float));
  }
  ctx.synchronize();
  return d;
}

DeviceBuffer<bf16> random_normal_bf16(Context& ctx, std::int64_t n, float stddev, std::uint64_t seed) {
  const DeviceBuffer<float> f = random_normal_fp32(ctx, n, stddev, seed);
  DeviceBuffer<bf16> b = allocate<bf16>(ctx, static_cast<std::size_t>(n));
  cast_fp32_to_bf16(ctx, n, f.data(), b.data());
  ctx.synchronize();
  return b;
}

}  // namespace dtrain::kernels::cuda
