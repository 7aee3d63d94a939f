#include "dtrain/kernels/cuda/memory.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "dtrain/common/error.h"

namespace dtrain::kernels::cuda {

namespace {

// Makes `device` current for the lifetime of the guard and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    DTRAIN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) DTRAIN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { (void)cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
constexpr std::size_t kSmallGranule = 512;

std::string mib(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

struct DevicePool::Impl {
  struct Block {
    std::size_t size = 0;
    Stream stream = nullptr;
  };
  int device = 0;
  bool caching = true;
  mutable std::mutex mutex;
  std::unordered_map<void*, Block> in_use;
  std::map<std::pair<Stream, std::size_t>, std::vector<void*>> free_lists;  // (stream, size class) -> blocks
  Stats stats;

  // Frees every cached block; the caller holds the mutex.
  void release_cached_locked() {
    if (free_lists.empty()) return;
    const auto lists = std::move(free_lists);
    free_lists.clear();
    DeviceGuard guard(device);
    cudaError_t first_error = cudaSuccess;
    for (const auto& [key, blocks] : lists) {
      for (void* p : blocks) {
        const cudaError_t s = cudaFree(p);
        if (s != cudaSuccess && first_error == cudaSuccess) first_error = s;
        stats.bytes_cached -= key.second;
      }
    }
    detail::check_cuda(first_error, "cudaFree of the pool's cached blocks", __FILE__, __LINE__);
  }
};

std::size_t DevicePool::size_class(std::size_t bytes) {
  if (bytes == 0) return 0;
  if (bytes <= kSmallLimit) return (bytes + kSmallGranule - 1) / kSmallGranule * kSmallGranule;
  const std::size_t step = std::bit_floor(bytes) / 4;
  return (bytes + step - 1) / step * step;
}

DevicePool::DevicePool(int device, bool caching) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->caching = caching;
}

DevicePool::~DevicePool() {
  std::lock_guard lock(impl_->mutex);
  try {
    impl_->release_cached_locked();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: cuda: releasing the device pool: %s\n", e.what());
  }
  if (!impl_->in_use.empty()) {
    std::fprintf(stderr, "dtrain: cuda: device pool destroyed with %zu blocks (%zu bytes) still in use; leaked\n",
                 impl_->in_use.size(), impl_->stats.bytes_in_use);
  }
}

void* DevicePool::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  Impl& m = *impl_;
  const std::size_t size = m.caching ? size_class(bytes) : bytes;
  std::lock_guard lock(m.mutex);
  if (m.caching) {
    auto it = m.free_lists.find({stream, size});
    if (it != m.free_lists.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      m.in_use.emplace(p, Impl::Block{size, stream});
      m.stats.bytes_cached -= size;
      m.stats.bytes_in_use += size;
      m.stats.peak_bytes_in_use = std::max(m.stats.peak_bytes_in_use, m.stats.bytes_in_use);
      ++m.stats.reuses;
      return p;
    }
  }
  DeviceGuard guard(m.device);
  void* p = nullptr;
  cudaError_t status = cudaMalloc(&p, size);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it, give the cache back, try once more
    m.release_cached_locked();
    status = cudaMalloc(&p, size);
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw internal_error("cuda: cannot allocate " + std::to_string(bytes) + " bytes (size class " +
                         std::to_string(size) + ") on device " + std::to_string(m.device) + ": " +
                         detail::describe(status) + "; the pool holds " + mib(m.stats.bytes_in_use) + " in use");
  }
  ++m.stats.device_allocations;
  m.in_use.emplace(p, Impl::Block{size, stream});
  m.stats.bytes_in_use += size;
  m.stats.peak_bytes_in_use = std::max(m.stats.peak_bytes_in_use, m.stats.bytes_in_use);
  // Only a cudaMalloc grows what the pool holds (a reuse moves a block from cached to in use).
  m.stats.peak_bytes_reserved = std::max(m.stats.peak_bytes_reserved, m.stats.bytes_in_use + m.stats.bytes_cached);
  return p;
}

void DevicePool::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  auto it = m.in_use.find(ptr);
  DTRAIN_CHECK(it != m.in_use.end(), "DevicePool::deallocate: pointer not allocated by this pool");
  const Impl::Block block = it->second;
  m.in_use.erase(it);
  m.stats.bytes_in_use -= block.size;
  if (m.caching) {
    m.free_lists[{block.stream, block.size}].push_back(ptr);
    m.stats.bytes_cached += block.size;
  } else {
    DeviceGuard guard(m.device);
    DTRAIN_CUDA_CHECK(cudaFree(ptr));  // synchronises the device: the stream's earlier work has finished with it
  }
}

void DevicePool::release_cached() {
  std::lock_guard lock(impl_->mutex);
  impl_->release_cached_locked();
}

DevicePool::Stats DevicePool::stats() const {
  std::lock_guard lock(impl_->mutex);
  Stats s = impl_->stats;
  s.bytes_reserved = s.bytes_in_use + s.bytes_cached;
  return s;
}

bool DevicePool::caching() const { return impl_->caching; }

}  // namespace dtrain::kernels::cuda
