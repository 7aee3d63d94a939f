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
// promises the same shapes and semantics, not the same bits.
//
// Element types. Activations are of one type per executor (ExecutorOptions::activations): fp32, or bf16 with fp32
// master weights, gradients and optimizer state (mixed precision). The model's kernels come as Kernels<A> for that
// type; everything else (memory, the fp32 reductions, the loss, AdamW) is on Backend itself. The CPU backend has
// both: fp32 (the kernels themselves) and bf16, which widens its inputs, runs the fp32 kernel and rounds each output
// once — what the CUDA kernels do, so it is the reference the GPU is checked against. The CUDA backend has bf16 only.
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

#include "dtrain/comm/communicator.h"
#include "dtrain/common/bf16.h"
#include "dtrain/common/dtype.h"
#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/cross_entropy.h"
#include "dtrain/kernels/dropout.h"
#include "dtrain/kernels/embedding.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/moe.h"
#include "dtrain/kernels/norm.h"
#include "dtrain/kernels/optimizer.h"
#include "dtrain/kernels/rope.h"

namespace dtrain::exec {

// A read-only range of backend memory: `size` floats from `data`.
struct ConstSpan {
  const float* data = nullptr;
  std::int64_t size = 0;
};

// The DType of an activation element type.
template <typename A>
inline constexpr DType kDTypeOf = std::is_same_v<A, float> ? DType::kFp32 : DType::kBf16;

// The model's kernels for activations of element type A (float or bf16): the signatures and semantics of
// dtrain::kernels::cpu, on backend memory. What is typed A: activations and their gradients, and the weights the
// passes read (linear weights and biases, embedding tables: for A = bf16, copies rounded from the fp32 master weights
// with from_fp32). What is always fp32: master weights where a kernel reads them directly (norm gamma/beta), every
// parameter gradient (accumulated, +=), and the statistics (norm mean/rstd, attention log-sum-exp, cross-entropy
// max/sums, RoPE tables). Kernels with A = bf16 compute in fp32 and round each output once.
template <typename A>
class Kernels {
 public:
  virtual ~Kernels() = default;

  // y[i] = x[i] rounded to A (the weight copies the passes read).
  virtual void from_fp32(std::int64_t n, const float* x, A* y) = 0;
  // x[r, j] += bias[j] for x [rows, cols] (a row-parallel layer's bias, added after the reduction).
  virtual void add_bias_rows(std::int64_t rows, std::int64_t cols, const A* bias, A* x) = 0;
  // dbias[j] += sum_r dy[r, j], rows in order (fp32 accumulation into dbias, as the bias gradient of a linear layer).
  virtual void accumulate_bias_grad(std::int64_t rows, std::int64_t cols, const A* dy, float* dbias) = 0;

  virtual void linear_forward(const kernels::LinearShape& shape, const A* x, const A* weight, const A* bias, A* y) = 0;
  virtual void linear_backward_input(const kernels::LinearShape& shape, const A* dy, const A* weight, A* dx) = 0;
  virtual void linear_backward_weight(const kernels::LinearShape& shape, const A* dy, const A* x, float* dweight,
                                      float* dbias) = 0;

  virtual void layernorm_forward(const kernels::NormShape& shape, const A* x, const float* gamma, const float* beta,
                                 float eps, A* y, float* mean, float* rstd) = 0;
  virtual void layernorm_backward(const kernels::NormShape& shape, const A* x, const float* gamma, const float* mean,
                                  const float* rstd, const A* dy, A* dx, float* dgamma, float* dbeta) = 0;
  virtual void rmsnorm_forward(const kernels::NormShape& shape, const A* x, const float* gamma, float eps, A* y,
                               float* rstd) = 0;
  virtual void rmsnorm_backward(const kernels::NormShape& shape, const A* x, const float* gamma, const float* rstd,
                                const A* dy, A* dx, float* dgamma) = 0;

  virtual void embedding_forward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const A* table,
                                 kernels::VocabShard shard, A* out) = 0;
  virtual void embedding_backward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const A* dout,
                                  kernels::VocabShard shard, float* dtable) = 0;
  virtual void position_embedding_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const A* pos,
                                          A* x) = 0;
  virtual void position_embedding_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const A* dx,
                                           float* dpos) = 0;

  virtual void dropout_add_forward(const kernels::HiddenLayout& layout, const A* x, const A* residual, float p,
                                   const kernels::DropoutKey& key, A* out) = 0;
  virtual void dropout_add_backward(const kernels::HiddenLayout& layout, const A* dout, float p,
                                    const kernels::DropoutKey& key, A* dx) = 0;
  // out[i] = a[i] + b[i]; out may alias a or b.
  virtual void residual_add(std::int64_t n, const A* a, const A* b, A* out) = 0;

  virtual void gelu_forward(std::int64_t n, const A* x, A* y) = 0;
  virtual void gelu_backward(std::int64_t n, const A* x, const A* dy, A* dx) = 0;
  virtual void swiglu_forward(std::int64_t tokens, std::int64_t ffn, const A* gate_up, A* y) = 0;
  virtual void swiglu_backward(std::int64_t tokens, std::int64_t ffn, const A* gate_up, const A* dy, A* dgate_up) = 0;

  // cos/sin: the fp32 table of kernels::rope_table, in backend memory. RopeShape::row_stride counts A elements.
  virtual void rope_forward(const kernels::RopeShape& shape, const float* cos, const float* sin, A* x) = 0;
  virtual void rope_backward(const kernels::RopeShape& shape, const float* cos, const float* sin, A* dx) = 0;

  // Strides count A elements; lse is fp32. The dropout description (may be nullptr) is a host object.
  virtual void attention_forward(const kernels::AttentionShape& shape, const A* q, const A* k, const A* v, A* o,
                                 float* lse, const kernels::AttentionDropout* dropout) = 0;
  virtual void attention_backward(const kernels::AttentionShape& shape, const A* q, const A* k, const A* v, const A* o,
                                  const float* lse, const A* dout, A* dq, A* dk, A* dv,
                                  const kernels::AttentionDropout* dropout) = 0;

  virtual void cross_entropy_max(std::int64_t tokens, const A* logits, kernels::VocabShard shard, float* max) = 0;
  virtual void cross_entropy_sum_exp(std::int64_t tokens, const A* logits, const std::int32_t* targets,
                                     kernels::VocabShard shard, const float* max, float* sum_exp,
                                     float* target_logit) = 0;
  // dlogits may alias logits.
  virtual void cross_entropy_backward(std::int64_t tokens, const A* logits, const std::int32_t* targets,
                                      kernels::VocabShard shard, const float* max, const float* sum_exp,
                                      const float* dloss, A* dlogits) = 0;

  // Grouped linear layers (a mixture of experts' experts): group g multiplies rows[g] consecutive rows (host array)
  // by its own weight weights[g] (host array of backend pointers), with linear_*'s layouts. The default runs one
  // linear_* call per non-empty group (what the CPU backend does); the CUDA backend runs one grouped GEMM.
  virtual void grouped_linear_forward(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                                      const A* x, const A* const* weights, A* y) {
    for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
      if (rows[g] > 0) linear_forward({rows[g], in, out}, x + r * in, weights[g], nullptr, y + r * out);
    }
  }
  virtual void grouped_linear_backward_input(std::int64_t groups, const std::int64_t* rows, std::int64_t in,
                                             std::int64_t out, const A* dy, const A* const* weights, A* dx) {
    for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
      if (rows[g] > 0) linear_backward_input({rows[g], in, out}, dy + r * out, weights[g], dx + r * in);
    }
  }
  virtual void grouped_linear_backward_weight(std::int64_t groups, const std::int64_t* rows, std::int64_t in,
                                              std::int64_t out, const A* dy, const A* x, float* const* dweights) {
    for (std::int64_t g = 0, r = 0; g < groups; r += rows[g], ++g) {
      if (rows[g] > 0) linear_backward_weight({rows[g], in, out}, dy + r * out, x + r * in, dweights[g], nullptr);
    }
  }

  // Mixture of experts (dtrain/kernels/moe.h): the router's logits and their gradient are typed A; probabilities,
  // gates and their gradients fp32; expert, rows and slot int32.
  virtual void moe_route(const kernels::MoeRouteShape& shape, const A* logits, float* probs, std::int32_t* expert,
                         float* gate) = 0;
  virtual void moe_route_backward(const kernels::MoeRouteShape& shape, const float* probs, const std::int32_t* expert,
                                  const float* dgate, const float* aux_grad, std::int64_t seq_len, A* dlogits) = 0;
  virtual void moe_gather_rows(std::int64_t n, std::int64_t cols, const A* src, const std::int32_t* rows, A* dst) = 0;
  virtual void moe_unpermute(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const A* src,
                             const std::int32_t* slot, const float* weight, bool accumulate, A* out) = 0;
  virtual void moe_unpermute_backward(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const A* dout,
                                      const A* src, const std::int32_t* slot, const float* gate, A* dsrc,
                                      float* dgate) = 0;
  // The shared experts' gate: g = sigmoid(z) (z typed A, g fp32); dz = g (1 - g) dg.
  virtual void moe_sigmoid_gate(std::int64_t tokens, const A* z, float* g) = 0;
  virtual void moe_sigmoid_gate_backward(std::int64_t tokens, const float* g, const float* dg, A* dz) = 0;
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
  // `bytes` of backend memory whose contents are undefined: for a tensor the next operation writes whole (a kernel's
  // output, a copy's destination), so that no pass over it zeroes what is overwritten anyway. The CPU backend fills
  // it with 0xff bytes (NaN in every float type, -1 as an integer), so that a test reading an element nothing wrote
  // sees NaN rather than a lucky zero; the CUDA backend leaves the device memory as the pool returns it.
  virtual void* allocate_uninitialized(std::size_t bytes) { return allocate(bytes); }
  // Returns memory from allocate() (same size). Work already queued on it may still complete first.
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
  // Bytes of backend memory this process holds through allocate(), now and at most so far: what the planner's memory
  // prediction is compared with (dtplan compare). CPU: the allocate() requests; CUDA: the device pool's size classes
  // in use (its cache of returned blocks not counted; DevicePool::Stats has that too).
  struct MemoryUse {
    std::int64_t in_use = 0;
    std::int64_t peak = 0;
  };
  virtual MemoryUse memory_use() const = 0;
  // The peak counts from now on (from what is in use now): dtexec train calls it once its setup (the executor's
  // buffers, a checkpoint or weights loaded whole) is done, so that the peak it reports is the training steps'.
  // The CUDA backend's pool keeps its own peak.
  virtual void reset_peak() {}
  // Memory a buffer keeps without using it for a while (fully sharded data parallelism: the other ranks' slices of a
  // unit's parameters and gradients between their uses). release: [x, x + bytes) of a buffer from allocate() reads
  // as zero bytes afterwards; the CPU backend gives the memory pages wholly inside it back to the system and counts
  // them out of memory_use until hold() counts them in again, which the caller does before it writes the range
  // (with the same x and bytes). The default zeroes the range and counts nothing.
  virtual void release(void* x, std::size_t bytes);
  virtual void hold(void* x, std::size_t bytes) {
    (void)x;
    (void)bytes;
  }
  // Copies within backend memory; the ranges must not overlap.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // Host -> backend and backend -> host. Both have finished with the host memory when they return.
  virtual void copy_to_backend(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  // x[i] = value for i in [0, n).
  virtual void fill(std::int64_t n, float value, float* x) = 0;

  // ---- fp32 work of the interpreter ----
  // sum_i x[i], accumulated in float64 in index order (the loss of a micro-batch).
  virtual double sum(std::int64_t n, const float* x) = 0;
  // sum of x[i]^2 over the spans, one float64 accumulator, spans and elements in order (the squared gradient norm).
  virtual double sum_squares(const std::vector<ConstSpan>& spans) = 0;
  // Writes loss[t]; the mean is left to sum() (it would need a copy back to the host).
  virtual void cross_entropy_loss(std::int64_t tokens, const float* max, const float* sum_exp,
                                  const float* target_logit, float* loss) = 0;
  // The buffer descriptions (host array) point into backend memory.
  virtual void adamw_step(const kernels::AdamWConfig& config, const kernels::AdamWBuffer* buffers,
                          std::int64_t count) = 0;

  // ---- the model's kernels, by activation type ----
  // nullptr when the backend has no kernels for that type.
  virtual Kernels<float>* fp32_kernels() { return nullptr; }
  virtual Kernels<bf16>* bf16_kernels() { return nullptr; }
  // Whether the backend runs activations of `dtype`.
  bool supports(DType dtype);
  // The kernels for A; throws dtrain::Error (input) naming the backend and the type when it has none.
  template <typename A>
  Kernels<A>& kernels();

  // ---- ordering with communicators ----
  // The memory communicators paired with this backend must take: host for a host-accessible backend, else device.
  comm::MemorySpace memory_space() const {
    return host_accessible() ? comm::MemorySpace::kHost : comm::MemorySpace::kDevice;
  }
  // A device backend queues its work on a stream, and a device communicator its operations on another (one per
  // group). order_before(comm): comm's operations issued from now on wait for the work queued here so far (so they
  // read finished data). order_after(comm): work queued here from now on waits for what comm has issued so far (so it
  // reads communicated data, and memory freed afterwards is not reused under it). The CPU backend finishes every call
  // before returning, as do the host communicators: both are no-ops there.
  virtual void order_before(comm::Communicator& comm) { (void)comm; }
  virtual void order_after(comm::Communicator& comm) { (void)comm; }
  // Blocks until the work queued so far has run. The measured trace (ExecutorOptions::record_trace) calls it after
  // each compute instruction, so that on a device backend the slice spans its kernels and not only their launches
  // (the step runs a little slower while traced). A no-op on the CPU backend, whose calls finish before returning.
  virtual void finish() {}
};

template <>
Kernels<float>& Backend::kernels<float>();
template <>
Kernels<bf16>& Backend::kernels<bf16>();

// The CPU backend: host memory, the kernels of dtrain::kernels::cpu. One process-wide, stateless instance.
Backend& cpu_backend();

// An owning array of T in a backend's memory, with std::vector's value semantics where the interpreter relies on
// them: a copy is a deep copy (Backend::copy), new elements are zero, resize keeps the leading elements. A
// default-constructed Buffer is empty and takes its backend from the first buffer assigned to it. A buffer made with
// kUninitialized has undefined elements (Backend::allocate_uninitialized): for outputs written whole.
struct Uninitialized {};
inline constexpr Uninitialized kUninitialized{};

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, std::size_t n) : backend_(&backend) { allocate(n); }
  Buffer(Backend& backend, std::size_t n, Uninitialized) : backend_(&backend) { allocate(n, false); }
  Buffer(Backend& backend, std::size_t n, float value) requires std::is_same_v<T, float> : Buffer(backend, n) {
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
  void allocate(std::size_t n, bool zero = true) {
    if (n == 0) return;
    data_ = static_cast<T*>(zero ? backend_->allocate(n * sizeof(T)) : backend_->allocate_uninitialized(n * sizeof(T)));
    size_ = n;
  }
  void copy_from(const Buffer& other) {
    if (other.size_ == 0) return;
    allocate(other.size_, false);
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
