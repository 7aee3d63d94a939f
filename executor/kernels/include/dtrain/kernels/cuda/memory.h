// Device memory for the CUDA backend: a caching allocator (DevicePool) and an owning buffer (DeviceBuffer<T>).
//
// cudaMalloc and cudaFree are slow (cudaFree also synchronises the whole device), so a training step must not call
// them per tensor. DevicePool keeps freed blocks and hands them out again, PyTorch's caching allocator in miniature:
//
// Size classes. A request is rounded up to its size class (size_class()): multiples of 512 bytes up to 1 MiB, above
//   that multiples of a quarter of the request's power of two (1.25, 1.5, 1.75, 2 x 2^k), so at most 25% of a large
//   block is slack. Blocks are never split or merged: a block serves only requests of its own class.
//
// Stream ordering. Every block belongs to the stream it was allocated for. deallocate() returns it to that stream's
//   free list at once, without waiting for the device: kernels queued on the stream before deallocate() may still be
//   reading or writing it, and that is safe because the block is only handed out again for the same stream, so its
//   next user's work is queued after theirs (the stream runs in order). A block is never handed to another stream.
//   Consequence for callers: if work on a *different* stream uses a block (a communication stream reading a gradient
//   buffer), make the owning stream wait for that work (cudaEventRecord + cudaStreamWaitEvent) before deallocating,
//   as PyTorch's Tensor.record_stream() does; otherwise the next user may overwrite data still being read.
//
// Out of memory. When cudaMalloc fails, the pool frees every cached block (cudaFree synchronises the device first)
//   and tries once more; if that fails too it throws dtrain::Error naming the request and the pool's usage.
//
// Caching off (DTRAIN_CUDA_POOL=0, see ContextOptions): every allocate() is a cudaMalloc of exactly the bytes asked
//   and every deallocate() a cudaFree, so compute-sanitizer's memcheck sees each tensor's true bounds (inside a
//   cached, rounded-up block an overrun goes unnoticed). Slow; for checking only.
//
// Thread safety: allocate/deallocate/stats may be called from several threads (a mutex guards the lists).
// Every block is 256-byte aligned (cudaMalloc's alignment).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace dtrain::kernels::cuda {

// A cudaStream_t, carried as void* so that code compiled without CUDA headers can hold one. nullptr is the legacy
// default stream.
using Stream = void*;

class DevicePool {
 public:
  struct Stats {
    std::size_t bytes_in_use = 0;         // handed out and not yet returned (size classes, not requests)
    std::size_t bytes_cached = 0;         // returned, kept for reuse
    std::size_t bytes_reserved = 0;       // bytes_in_use + bytes_cached: what the pool holds from the device
                                          // (PyTorch's memory_reserved; what nvidia-smi counts for the pool)
    std::size_t peak_bytes_in_use = 0;    // highest bytes_in_use so far
    std::size_t peak_bytes_reserved = 0;  // highest bytes_reserved so far
    std::int64_t device_allocations = 0;  // cudaMalloc calls made
    std::int64_t reuses = 0;              // allocations served from the cache
  };

  // The pool allocates on `device` (made current for each cudaMalloc/cudaFree). caching = false: no cache (see above).
  explicit DevicePool(int device, bool caching = true);
  // Frees every cached block. Blocks still handed out are leaked with a message on stderr (freeing memory a kernel may
  // still use would be worse); destroy DeviceBuffers before their pool.
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes` for use on `stream` (nullptr for bytes == 0). Throws dtrain::Error when the device is
  // out of memory even after the cache is released.
  void* allocate(std::size_t bytes, Stream stream);
  // Returns a block from allocate() to its stream's free list (nullptr is ignored). Throws dtrain::Error (internal)
  // for a pointer this pool did not hand out.
  void deallocate(void* ptr);
  // cudaFree of every cached block (synchronises the device).
  void release_cached();
  Stats stats() const;
  bool caching() const;

  // The size class of a request (0 for 0).
  static std::size_t size_class(std::size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Owns `count` elements of T from a DevicePool for one stream; move-only. Returns its block on destruction (stream
// ordered, see DevicePool). Contents are uninitialised.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DevicePool& pool, std::size_t count, Stream stream)
      : pool_(&pool), ptr_(static_cast<T*>(pool.allocate(count * sizeof(T), stream))), count_(count) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)),
        ptr_(std::exchange(other.ptr_, nullptr)),
        count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = std::exchange(other.pool_, nullptr);
      ptr_ = std::exchange(other.ptr_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return ptr_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  bool empty() const { return count_ == 0; }

  // Returns the block to the pool now.
  void reset() noexcept {
    if (pool_ != nullptr && ptr_ != nullptr) {
      try {
        pool_->deallocate(ptr_);
      } catch (...) {  // only for a pointer the pool does not know: nothing sensible to do in a destructor
      }
    }
    ptr_ = nullptr;
    count_ = 0;
  }

 private:
  DevicePool* pool_ = nullptr;
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace dtrain::kernels::cuda
