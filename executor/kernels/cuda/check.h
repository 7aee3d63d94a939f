// Internal: error checking for CUDA runtime and cuBLASLt calls, shared by the host (.cc) and device (.cu) sources of
// the CUDA backend. Every call's status is checked; a failure throws dtrain::Error (internal).
#pragma once

#include <cuda_runtime_api.h>

#include "dtrain/kernels/cuda/context.h"

namespace dtrain::kernels::cuda::detail {

// Throws dtrain::Error: "cuda: <what> failed: <reason> (<file>:<line>)".
[[noreturn]] void throw_cuda_error(const char* what, const char* reason, const char* file, int line);

// "<cudaGetErrorString> (<cudaGetErrorName>)".
const char* describe(cudaError_t status);

inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda_error(what, describe(status), file, line);
}

// After a kernel launch: reports a launch failure (bad configuration, no kernel image for this GPU, too much shared
// memory) and, when the context synchronises after each launch, a fault while the kernel ran.
void check_launch(Context& ctx, const char* kernel, const char* file, int line);

inline cudaStream_t stream_of(Context& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

}  // namespace dtrain::kernels::cuda::detail

#define DTRAIN_CUDA_CHECK(call) ::dtrain::kernels::cuda::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define DTRAIN_CUDA_CHECK_LAUNCH(ctx, kernel) \
  ::dtrain::kernels::cuda::detail::check_launch((ctx), (kernel), __FILE__, __LINE__)
