// The CUDA backend's entry points in a build without CUDA (DTRAIN_ENABLE_CUDA=OFF): they say so.
#include <fmt/format.h>

#include "dtrain/common/error.h"
#include "dtrain/exec/cuda_backend.h"

namespace dtrain::exec {

bool cuda_backend_built() { return false; }

std::string cuda_backend_unavailable_reason(int) {
  return "this build has no CUDA backend (configured with DTRAIN_ENABLE_CUDA=OFF, or nvcc/NCCL were not found)";
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  throw input_error("--device cuda: " + cuda_backend_unavailable_reason(device));
}

}  // namespace dtrain::exec
