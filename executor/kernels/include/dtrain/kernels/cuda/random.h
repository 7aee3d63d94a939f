// Device buffers of random values, for benchmarks and calibration (not for training: the executor initialises
// parameters with its own seeded scheme, params.h). One block of 2^22 normal floats is drawn on the host and uploaded
// as many times as the buffer needs: drawing hundreds of millions of normals on the host would take longer than what
// they are measured with. Random rather than constant inputs because a GEMM's power draw, and so its clocks, depend a
// little on the data: constant inputs would flatter.
#pragma once

#include <cstdint>

#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda {

// n values drawn from N(0, stddev^2) (the same block repeated), ready when the call returns.
DeviceBuffer<float> random_normal_fp32(Context& ctx, std::int64_t n, float stddev, std::uint64_t seed);
// The same, rounded to bf16.
DeviceBuffer<bf16> random_normal_bf16(Context& ctx, std::int64_t n, float stddev, std::uint64_t seed);

}  // namespace dtrain::kernels::cuda
