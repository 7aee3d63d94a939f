// The CUDA backend's entry points in a build without CUDA (DTRAIN_ENABLE_CUDA=OFF): they say so.
#include <fmt/format.h>

#include "dtrain/common/error.h"
#include "dtrain/exec/cuda_backend.h"
#include "layer_gemms.h"

namespace dtrain::exec {

bool cuda_backend_built() { return false; }

std::string cuda_backend_unavailable_reason(int) {
  return "this build has no CUDA backend (configured with DTRAIN_ENABLE_CUDA=OFF, or nvcc/NCCL were not found)";
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  throw input_error("--device cuda: " + cuda_backend_unavailable_reason(device));
}

namespace detail {
kernels::cuda::Context* cuda_context(Backend&) { return nullptr; }
// The signature of cuda_fp8_gemms.cc's, which moves the sites.
std::unique_ptr<LayerGemms<bf16>> cuda_fp8_gemms(kernels::cuda::Context&, Kernels<bf16>&, const model::TrainingSpec&,
                                                 ParameterSites) {  // NOLINT(performance-unnecessary-value-param)
  throw internal_error("cuda_fp8_gemms: this build has no CUDA backend");
}
}  // namespace detail

}  // namespace dtrain::exec
