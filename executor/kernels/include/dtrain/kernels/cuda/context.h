// The CUDA backend of dtrain::kernels: bf16 activations and weights, fp32 master weights, gradients and statistics.
//
// Every function in dtrain::kernels::cuda computes what the function of the same name in dtrain::kernels::cpu
// computes (same formulas, layouts, shape structs and accumulate/overwrite conventions; see the headers in
// dtrain/kernels/), so the executor can switch backends op by op. What differs is the element types, stated in each
// header of dtrain/kernels/cuda/:
//   - activations and their gradients: bf16 (dtrain::bf16, dtrain/common/bf16.h), computed in fp32 and rounded once;
//   - weights read by the forward and backward passes (linear, embedding tables): bf16 copies of the fp32 master
//     weights (cast_fp32_to_bf16 after each optimizer step); norm weights are read in fp32 directly (a few KB);
//   - parameter gradients: fp32, accumulated (+=), what AdamW and the gradient norm read;
//   - statistics (norm mean/rstd, attention log-sum-exp, cross-entropy max/sums/loss): fp32.
//
// Execution model. A Context owns (or borrows) one CUDA stream and everything work on it needs: a cuBLASLt handle and
// workspace, a cache of GEMM plans, and a DevicePool. Every kernel function is asynchronous: it queues work on the
// context's stream and returns; pointers are device pointers unless a function says otherwise, and must stay valid
// until the stream has run the work. Errors: every CUDA and cuBLASLt call is checked and a failure throws
// dtrain::Error (category internal, message "cuda: <call> failed: <reason> (<file>:<line>)"); a kernel that faults
// asynchronously is reported by the next checked call (with sync_after_launch, by the launch that faulted).
//
// Determinism: on one GPU model and driver, every function gives bitwise identical results run to run. No kernel
// reduces floating-point values with atomics: reductions run in a fixed order independent of timing (column sums in
// fixed row chunks, block reductions in warp order, grid-wide sums in a second fixed-order pass). The one use of
// atomics (embedding_backward) is an integer atomicMin, whose result does not depend on the order. GEMMs use one
// cuBLASLt algorithm per shape, chosen once and cached, with a fixed workspace.
//
// Threads: a Context is used by one host thread at a time (the GEMM plan cache is not locked). Contexts on different
// streams may share a GPU.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "dtrain/common/bf16.h"
#include "dtrain/kernels/cuda/memory.h"

namespace dtrain::kernels::cuda {

// Number of CUDA devices visible to this process; 0 when there is none or no usable driver (never throws).
int device_count();

// "" when `device` can run kernels; otherwise "no CUDA device: <cudaGetErrorString of the failing call>" (or
// "no CUDA device: device <n> of <count>" when the index is out of range). GPU tests skip with this text.
std::string device_unavailable_reason(int device = 0);

struct ContextOptions {
  int device = 0;
  Stream stream = nullptr;                              // nullptr: the context creates its own non-blocking stream
  std::size_t workspace_bytes = std::size_t{32} << 20;  // cuBLASLt workspace (32 MiB: cuBLAS's advice for Hopper)
  bool sync_after_launch = false;  // synchronise and check after every kernel (locates asynchronous faults)
  bool pool_caching = true;        // DevicePool caching (off: plain cudaMalloc/cudaFree, for compute-sanitizer)

  // Defaults, overridden by the environment: DTRAIN_CUDA_SYNC=1 sets sync_after_launch, DTRAIN_CUDA_POOL=0 turns
  // pool caching off. Throws dtrain::Error (input) for another value of either variable.
  static ContextOptions from_environment();
};

// What the driver says of a device (cudaGetDeviceProperties, cudaMemGetInfo): for reports and calibration.
struct DeviceInfo {
  std::string name;              // as the driver names it, e.g. "NVIDIA H100 80GB HBM3"
  std::size_t total_memory = 0;  // bytes
  std::size_t free_memory = 0;   // bytes free when asked
  int multiprocessors = 0;
  int compute_capability = 0;  // major * 10 + minor
};
// Throws dtrain::Error when the device cannot be used (the message starts with device_unavailable_reason()'s text).
DeviceInfo device_info(int device = 0);

class Context {
 public:
  // Makes options.device current on the calling thread, creates the stream (unless given), the cuBLASLt handle, the
  // workspace and the pool. Throws dtrain::Error when there is no usable device (the message starts with
  // device_unavailable_reason()'s text) or any CUDA call fails.
  explicit Context(const ContextOptions& options = {});
  // Waits for the stream, then frees what the context created. Never throws (errors go to stderr).
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const;
  Stream stream() const;
  DevicePool& pool();
  const DevicePool& pool() const;
  bool sync_after_launch() const;
  // Blocks until all work queued on the stream has finished; throws dtrain::Error if any of it failed.
  void synchronize();

  // The backend's internals (cuda/context_impl.h); not for callers.
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// A buffer of `count` T from the context's pool, for its stream.
template <class T>
DeviceBuffer<T> allocate(Context& ctx, std::size_t count) {
  return DeviceBuffer<T>(ctx.pool(), count, ctx.stream());
}

// Copies queued on the context's stream. copy_to_device returns once pageable `src` may be reused (the driver stages
// pageable memory before returning; page-locked `src` must stay unchanged until the stream has run the copy);
// copy_to_host returns when `dst` holds the data (it synchronises the stream, and so reports any earlier asynchronous
// failure).
void copy_to_device(Context& ctx, void* dst, const void* src, std::size_t bytes);
void copy_to_host(Context& ctx, void* dst, const void* src, std::size_t bytes);
void copy_on_device(Context& ctx, void* dst, const void* src, std::size_t bytes);
// Every byte of [ptr, ptr + bytes) set to `value` (cudaMemsetAsync). 0xff bytes make every float and bf16 a NaN,
// which is how tests poison outputs.
void memset_device(Context& ctx, void* ptr, int value, std::size_t bytes);

}  // namespace dtrain::kernels::cuda
