// The device backend of the executor: where its tensors live and what runs on them.
//
// The interpreter (executor.h) never touches tensor elements itself. Every tensor it keeps (parameters, gradients,
// Adam moments, activations, the token ids) is a Buffer allocated by a Backend, and every operation on elements —
// the model's kernels, but also the copies, fills, bias adds, bias gradients and the float64 reductions of the loss
// and the gradient norm — is a Backend call. Host values cross only through copy_to_backend / copy_to_host.
//
// Pointers into backend memory ("device pointers": Buffer::data() and offsets from it) may live in device memory
// and must not be dereferenced by the caller unless host_accessible() is true. Communicators receive them as they
// are: a host-memory backend pairs with the in-process and Gloo communicators, a device-memory backend with a
// communicator that takes device pointers (NCCL).
//
// Numerics. Every operation is defined by the CPU kernels in dtrain::kernels (the header of each names its layouts
// and accumulation order); the CPU backend calls them, so the interpreter's results are those of the kernels
// bit-for-bit. The reductions below fix their order (index order, float64) for the same reason. A device backend
// promises the same shapes and semantics, not the same bits. The interface is fp32 throughout: a backend that keeps
// activations in bf16 converts inside its kernels.
//
// Threading: one backend object may serve several executors (one per rank thread in the tests); the CPU backend is
// stateless. Errors: a backend reports failures as dtrain::Error; the CPU backend's allocate lets std::bad_alloc
// through, as the std::vector tensors it replaced did.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/cross_entropy.h"
#include "dtrain/kernels/dropout.h"
#include "dtrain/kernels/embedding.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/norm.h"
#include "dtrain/kernels/optimizer.h"
#include "dtrain/kernels/rope.h"

namespace dtrain::exec {

// A read-only range of backend memory: `size` floats from `data`.
struct ConstSpan {
  const float* data = nullptr;
  std::int64_t size = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda".
  virtual std::string_view name() const = 0;
  // True when backend memory is ordinary host memory (the caller may read and write through Buffer::data()).
  virtual bool host_accessible() const = 0;

  // ---- memory ----
  // `bytes` of backend memory, zero-filled (as std::vector's value-initialised elements). Never nullptr for bytes > 0.
  virtual void* allocate(std::size_t bytes) = 0;
  // Returns memory from allocate() (same size). Work already queued on it may still complete first.
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
  // Copies within backend memory; the ranges must not overlap.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // Host -> backend and backend -> host. Both have finished with the host memory when they return.
  virtual void copy_to_backend(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  // x[i] = value for i in [0, n).
  virtual void fill(std::int64_t n, float value, float* x) = 0;

  // ---- element-wise work and reductions of the interpreter ----
  // x[r, j] += bias[j] for x [rows, cols] (a row-parallel layer's bias, added after the reduction).
  virtual void add_bias_rows(std::int64_t rows, std::int64_t cols, const float* bias, float* x) = 0;
  // dbias[j] += sum_r dy[r, j], rows in order (fp32 accumulation into dbias, as the bias gradient of a linear layer).
  virtual void accumulate_bias_grad(std::int64_t rows, std::int64_t cols, const float* dy, float* dbias) = 0;
  // sum_i x[i], accumulated in float64 in index order (the loss of a micro-batch).
  virtual double sum(std::int64_t n, const float* x) = 0;
  // sum of x[i]^2 over the spans, one float64 accumulator, spans and elements in order (the squared gradient norm).
  virtual double sum_squares(const std::vector<ConstSpan>& spans) = 0;

  // ---- kernels: the signatures and semantics of dtrain::kernels::cpu, on backend memory ----
  virtual void linear_forward(const kernels::LinearShape& shape, const float* x, const float* weight,
                              const float* bias, float* y) = 0;
  virtual void linear_backward_input(const kernels::LinearShape& shape, const float* dy, const float* weight,
                                     float* dx) = 0;
  virtual void linear_backward_weight(const kernels::LinearShape& shape, const float* dy, const float* x,
                                      float* dweight, float* dbias) = 0;

  virtual void layernorm_forward(const kernels::NormShape& shape, const float* x, const float* gamma,
                                 const float* beta, float eps, float* y, float* mean, float* rstd) = 0;
  virtual void layernorm_backward(const kernels::NormShape& shape, const float* x, const float* gamma,
                                  const float* mean, const float* rstd, const float* dy, float* dx, float* dgamma,
                                  float* dbeta) = 0;
  virtual void rmsnorm_forward(const kernels::NormShape& shape, const float* x, const float* gamma, float eps,
                               float* y, float* rstd) = 0;
  virtual void rmsnorm_backward(const kernels::NormShape& shape, const float* x, const float* gamma,
                                const float* rstd, const float* dy, float* dx, float* dgamma) = 0;

  virtual void embedding_forward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids,
                                 const float* table, kernels::VocabShard shard, float* out) = 0;
  virtual void embedding_backward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids,
                                  const float* dout, kernels::VocabShard shard, float* dtable) = 0;
  virtual void position_embedding_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden,
                                          const float* pos, float* x) = 0;
  virtual void position_embedding_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden,
                                           const float* dx, float* dpos) = 0;

  virtual void dropout_add_forward(const kernels::HiddenLayout& layout, const float* x, const float* residual,
                                   float p, const kernels::DropoutKey& key, float* out) = 0;
  virtual void dropout_add_backward(const kernels::HiddenLayout& layout, const float* dout, float p,
                                    const kernels::DropoutKey& key, float* dx) = 0;
  // out[i] = a[i] + b[i]; out may alias a or b.
  virtual void residual_add(std::int64_t n, const float* a, const float* b, float* out) = 0;

  virtual void gelu_forward(std::int64_t n, const float* x, float* y) = 0;
  virtual void gelu_backward(std::int64_t n, const float* x, const float* dy, float* dx) = 0;
  virtual void swiglu_forward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, float* y) = 0;
  virtual void swiglu_backward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, const float* dy,
                               float* dgate_up) = 0;

  // cos/sin: the table of kernels::rope_table, in backend memory.
  virtual void rope_forward(const kernels::RopeShape& shape, const float* cos, const float* sin, float* x) = 0;
  virtual void rope_backward(const kernels::RopeShape& shape, const float* cos, const float* sin, float* dx) = 0;

  // The dropout description (may be nullptr) is a host object.
  virtual void attention_forward(const kernels::AttentionShape& shape, const float* q, const float* k,
                                 const float* v, float* o, float* lse, const kernels::AttentionDropout* dropout) = 0;
  virtual void attention_backward(const kernels::AttentionShape& shape, const float* q, const float* k,
                                  const float* v, const float* o, const float* lse, const float* dout, float* dq,
                                  float* dk, float* dv, const kernels::AttentionDropout* dropout) = 0;

  virtual void cross_entropy_max(std::int64_t tokens, const float* logits, kernels::VocabShard shard,
                                 float* max) = 0;
  virtual void cross_entropy_sum_exp(std::int64_t tokens, const float* logits, const std::int32_t* targets,
                                     kernels::VocabShard shard, const float* max, float* sum_exp,
                                     float* target_logit) = 0;
  // Writes loss[t]; the mean is left to sum() (it would need a copy back to the host).
  virtual void cross_entropy_loss(std::int64_t tokens, const float* max, const float* sum_exp,
                                  const float* target_logit, float* loss) = 0;
  virtual void cross_entropy_backward(std::int64_t tokens, const float* logits, const std::int32_t* targets,
                                      kernels::VocabShard shard, const float* max, const float* sum_exp,
                                      const float* dloss, float* dlogits) = 0;

  // The buffer descriptions (host array) point into backend memory.
  virtual void adamw_step(const kernels::AdamWConfig& config, const kernels::AdamWBuffer* buffers,
                          std::int64_t count) = 0;
};

// The CPU backend: host memory, the kernels of dtrain::kernels::cpu. One process-wide, stateless instance.
Backend& cpu_backend();

// An owning array of T in a backend's memory, with std::vector's value semantics where the interpreter relies on
// them: a copy is a deep copy (Backend::copy), new elements are zero, resize keeps the leading elements. A
// default-constructed Buffer is empty and takes its backend from the first buffer assigned to it.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, std::size_t n) : backend_(&backend) { allocate(n); }
  Buffer(Backend& backend, std::size_t n, float value)
    requires std::is_same_v<T, float>
      : Buffer(backend, n) {
    if (n > 0) backend_->fill(static_cast<std::int64_t>(n), value, data_);
  }
  Buffer(const Buffer& other) : backend_(other.backend_) { copy_from(other); }
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(const Buffer& other) {
    if (this != &other) {
      Buffer copy(other);
      swap(copy);
    }
    return *this;
  }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Buffer moved(std::move(other));
      swap(moved);
    }
    return *this;
  }
  ~Buffer() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Backend* backend() const { return backend_; }

  void clear() { release(); }
  void swap(Buffer& other) noexcept {
    std::swap(backend_, other.backend_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }
  // As std::vector::resize: the first min(size(), n) elements kept, the rest zero.
  void resize(std::size_t n) {
    if (n == size_) return;
    Buffer bigger(*backend_, n);
    std::size_t keep = std::min(n, size_);
    if (keep > 0) backend_->copy(bigger.data_, data_, keep * sizeof(T));
    swap(bigger);
  }

 private:
  void allocate(std::size_t n) {
    if (n == 0) return;
    data_ = static_cast<T*>(backend_->allocate(n * sizeof(T)));
    size_ = n;
  }
  void copy_from(const Buffer& other) {
    if (other.size_ == 0) return;
    allocate(other.size_);
    backend_->copy(data_, other.data_, size_ * sizeof(T));
  }
  void release() noexcept {
    if (data_ != nullptr) backend_->deallocate(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }

  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dtrain::exec
