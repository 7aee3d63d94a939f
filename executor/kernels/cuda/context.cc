#include "dtrain/kernels/cuda/context.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cuda/check.h"
#include "cuda/context_impl.h"
#include "dtrain/common/error.h"

namespace dtrain::kernels::cuda {

namespace detail {

namespace {

std::string_view base_name(std::string_view path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

void throw_cuda_error(const char* what, const char* reason, const char* file, int line) {
  throw internal_error("cuda: " + std::string(what) + " failed: " + reason + " (" + std::string(base_name(file)) + ":" +
                       std::to_string(line) + ")");
}

const char* describe(cudaError_t status) {
  // One string per distinct error, kept for the life of the process (a handful at most).
  thread_local std::string text;
  text = std::string(cudaGetErrorString(status)) + " (" + cudaGetErrorName(status) + ")";
  return text.c_str();
}

void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    const std::string reason =
        std::string(cublasLtGetStatusString(status)) + " (" + cublasLtGetStatusName(status) + ")";
    throw_cuda_error(what, reason.c_str(), file, line);
  }
}

void check_launch(Context& ctx, const char* kernel, const char* file, int line) {
  check_cuda(cudaGetLastError(), kernel, file, line);
  if (ctx.sync_after_launch()) check_cuda(cudaStreamSynchronize(stream_of(ctx)), kernel, file, line);
}

}  // namespace detail

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error for later calls
    return 0;
  }
  return n;
}

std::string device_unavailable_reason(int device) {
  int n = 0;
  const cudaError_t count_status = cudaGetDeviceCount(&n);
  if (count_status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: ") + detail::describe(count_status);
  }
  if (n == 0) return "no CUDA device: cudaGetDeviceCount found none";
  if (device < 0 || device >= n) {
    return "no CUDA device: device " + std::to_string(device) + " requested, " + std::to_string(n) + " visible";
  }
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = device;
  std::string reason;
  if (const cudaError_t s = cudaSetDevice(device); s != cudaSuccess) {
    reason = std::string("no CUDA device: cudaSetDevice(") + std::to_string(device) + "): " + detail::describe(s);
  } else if (const cudaError_t p = detail::probe_kernel_image(); p != cudaSuccess) {
    cudaDeviceProp prop{};
    const bool have_prop = cudaGetDeviceProperties(&prop, device) == cudaSuccess;
    reason = std::string("no CUDA device: the kernels cannot run on device ") + std::to_string(device) +
             (have_prop ? " (" + std::string(prop.name) + ", compute capability " + std::to_string(prop.major) + "." +
                              std::to_string(prop.minor) + ")"
                        : std::string()) +
             ": " + detail::describe(p) + "; rebuild with CMAKE_CUDA_ARCHITECTURES including this GPU";
  }
  (void)cudaGetLastError();
  (void)cudaSetDevice(previous);
  return reason;
}

DeviceInfo device_info(int device) {
  const std::string reason = device_unavailable_reason(device);
  if (!reason.empty()) throw internal_error(reason);
  cudaDeviceProp prop{};
  DTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int previous = 0;
  DTRAIN_CUDA_CHECK(cudaGetDevice(&previous));
  DTRAIN_CUDA_CHECK(cudaSetDevice(device));
  DeviceInfo info;
  const cudaError_t s = cudaMemGetInfo(&info.free_memory, &info.total_memory);
  (void)cudaSetDevice(previous);
  DTRAIN_CUDA_CHECK(s);
  info.name = prop.name;
  info.multiprocessors = prop.multiProcessorCount;
  info.compute_capability = prop.major * 10 + prop.minor;
  return info;
}

namespace {

bool env_flag(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  const std::string_view v(value);
  if (v == "1") return true;
  if (v == "0") return false;
  throw input_error(std::string(name) + "=" + value + ": expected 0 or 1");
}

}  // namespace

ContextOptions ContextOptions::from_environment() {
  ContextOptions o;
  o.sync_after_launch = env_flag("DTRAIN_CUDA_SYNC", o.sync_after_launch);
  o.pool_caching = env_flag("DTRAIN_CUDA_POOL", o.pool_caching);
  return o;
}

Context::Impl::~Impl() {
  auto report = [](const char* what, cudaError_t s) {
    if (s != cudaSuccess)
      std::fprintf(stderr, "dtrain: cuda: %s failed while destroying a context: %s\n", what, detail::describe(s));
  };
  if (stream != nullptr) report("cudaStreamSynchronize", cudaStreamSynchronize(stream));
  matmul_plans.clear();
  pool.reset();
  if (blas != nullptr) {
    const cublasStatus_t s = cublasDestroy(blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "dtrain: cuda: cublasDestroy failed: %s\n", cublasLtGetStatusString(s));
    }
  }
  if (workspace != nullptr) report("cudaFree(workspace)", cudaFree(workspace));
  if (lt != nullptr) {
    const cublasStatus_t s = cublasLtDestroy(lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "dtrain: cuda: cublasLtDestroy failed: %s\n", cublasLtGetStatusString(s));
    }
  }
  if (owns_stream && stream != nullptr) report("cudaStreamDestroy", cudaStreamDestroy(stream));
}

Context::Context(const ContextOptions& options) : impl_(std::make_unique<Impl>()) {
  const std::string reason = device_unavailable_reason(options.device);
  if (!reason.empty()) throw internal_error(reason + " (cannot create a CUDA context)");
  Impl& m = *impl_;
  m.device = options.device;
  m.sync_after_launch = options.sync_after_launch;
  DTRAIN_CUDA_CHECK(cudaSetDevice(options.device));
  if (options.stream != nullptr) {
    m.stream = static_cast<cudaStream_t>(options.stream);
  } else {
    DTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
    m.owns_stream = true;
  }
  DTRAIN_CUBLAS_CHECK(cublasLtCreate(&m.lt));
  if (options.workspace_bytes > 0) {
    DTRAIN_CUDA_CHECK(cudaMalloc(&m.workspace, options.workspace_bytes));
    m.workspace_bytes = options.workspace_bytes;
  }
  m.pool = std::make_unique<DevicePool>(options.device, options.pool_caching);
}

Context::~Context() = default;

int Context::device() const { return impl_->device; }
Stream Context::stream() const { return impl_->stream; }
DevicePool& Context::pool() { return *impl_->pool; }
const DevicePool& Context::pool() const { return *impl_->pool; }
bool Context::sync_after_launch() const { return impl_->sync_after_launch; }

void Context::synchronize() { DTRAIN_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

void copy_to_device(Context& ctx, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  DTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, detail::stream_of(ctx)));
}

void copy_to_host(Context& ctx, void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) DTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, detail::stream_of(ctx)));
  DTRAIN_CUDA_CHECK(cudaStreamSynchronize(detail::stream_of(ctx)));
}

void copy_on_device(Context& ctx, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  DTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, detail::stream_of(ctx)));
}

void memset_device(Context& ctx, void* ptr, int value, std::size_t bytes) {
  if (bytes == 0) return;
  DTRAIN_CUDA_CHECK(cudaMemsetAsync(ptr, value, bytes, detail::stream_of(ctx)));
}

}  // namespace dtrain::kernels::cuda
