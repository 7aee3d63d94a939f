// The CUDA backend of the executor: tensors in one GPU's memory, the bf16 kernels of dtrain::kernels::cuda.
//
// Activations are bf16 only (Kernels<bf16>; an fp32 request is refused when the executor is made); master weights,
// gradients and Adam moments fp32. Every call queues work on the backend's one compute stream (a
// kernels::cuda::Context: its cuBLASLt handle, GEMM plan cache and device pool) and returns; what waits for the GPU:
//   - copy_to_host (checkpoints, Executor::read) and sum() (the micro-batch loss: its per-token losses come back to
//     the host and are summed in float64 in index order, as on the CPU), sum_squares() (the gradient norm, reduced
//     on the device in float64, one double copied back);
//   - nothing else: memory is allocated and freed stream-ordered (DevicePool), so the host runs ahead of the GPU.
// Communicators: pair it with NCCL (device memory). Each NCCL group orders its operations on its own stream;
// order_before(comm) makes comm's stream wait for the compute work queued so far (a CUDA event), order_after(comm)
// makes later compute work wait for what comm has queued. The interpreter calls them around every communication, and
// defers order_after for the data-parallel gradient reductions until the optimizer needs the gradients, so that
// those reductions run while the backward pass goes on.
//
// Errors: every CUDA call is checked (dtrain::Error naming the call); a kernel fault surfaces at the next checked
// call. DTRAIN_CUDA_SYNC=1 and DTRAIN_CUDA_POOL=0 apply (kernels/cuda/context.h).
#pragma once

#include <memory>
#include <string>

#include "dtrain/exec/backend.h"

namespace dtrain::exec {

// Whether this build has the CUDA backend (DTRAIN_ENABLE_CUDA: nvcc, cuBLAS and NCCL were found).
bool cuda_backend_built();

// "" when CUDA device `device` can run the backend; else why not ("no CUDA device: ...", or "this build has no CUDA
// backend ..."). Never throws.
std::string cuda_backend_unavailable_reason(int device);

// The backend on CUDA device `device` (an index among the devices this process sees). Throws dtrain::Error (input)
// with cuda_backend_unavailable_reason()'s text when there is no such device or no CUDA in this build.
std::unique_ptr<Backend> make_cuda_backend(int device);

}  // namespace dtrain::exec
