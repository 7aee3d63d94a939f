// The CUDA backend (cuda_backend.h): Backend and Kernels<bf16> over dtrain::kernels::cuda, on one Context's stream.
#include "dtrain/exec/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdio>
#include <vector>

#include "dtrain/comm/nccl.h"
#include "dtrain/common/error.h"
#include "dtrain/kernels/cuda/activation.h"
#include "dtrain/kernels/cuda/attention.h"
#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/cuda/cross_entropy.h"
#include "dtrain/kernels/cuda/dropout.h"
#include "dtrain/kernels/cuda/elementwise.h"
#include "dtrain/kernels/cuda/embedding.h"
#include "dtrain/kernels/cuda/grouped_linear.h"
#include "dtrain/kernels/cuda/linear.h"
#include "dtrain/kernels/cuda/moe.h"
#include "dtrain/kernels/cuda/norm.h"
#include "dtrain/kernels/cuda/optimizer.h"
#include "dtrain/kernels/cuda/rope.h"
#include "layer_gemms.h"

namespace dtrain::exec {

namespace {

namespace k = dtrain::kernels;
namespace kc = dtrain::kernels::cuda;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw internal_error(
        fmt::format("cuda: {} failed: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status)));
  }
}

class CudaBackend final : public Backend, public Kernels<bf16> {
 public:
  explicit CudaBackend(int device) : ctx_(options(device)) {}
  kc::Context& context() { return ctx_; }

  std::string_view name() const override { return "cuda"; }
  bool host_accessible() const override { return false; }
  void finish() override { ctx_.synchronize(); }

  // ---- memory: the context's pool, stream-ordered ----
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = ctx_.pool().allocate(bytes, ctx_.stream());
    kc::memset_device(ctx_, p, 0, bytes);
    return p;
  }
  void* allocate_uninitialized(std::size_t bytes) override {
    return bytes == 0 ? nullptr : ctx_.pool().allocate(bytes, ctx_.stream());
  }
  void deallocate(void* ptr, std::size_t) noexcept override {
    try {
      ctx_.pool().deallocate(ptr);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dtrain: cuda backend: deallocate: %s\n", e.what());
    }
  }
  MemoryUse memory_use() const override {
    const auto stats = ctx_.pool().stats();
    return {static_cast<std::int64_t>(stats.bytes_in_use), static_cast<std::int64_t>(stats.peak_bytes_in_use)};
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) kc::copy_on_device(ctx_, dst, src, bytes);
  }
  void copy_to_backend(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes > 0) kc::copy_to_device(ctx_, dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) kc::copy_to_host(ctx_, host_dst, src, bytes);
  }
  void fill(std::int64_t n, float value, float* x) override {
    if (n > 0) kc::fill(ctx_, n, value, x);
  }

  // ---- fp32 work ----
  double sum(std::int64_t n, const float* x) override {
    std::vector<float> host(static_cast<std::size_t>(n));
    copy_to_host(host.data(), x, host.size() * sizeof(float));
    double s = 0;
    for (float v : host) s += v;
    return s;
  }
  double sum_squares(const std::vector<ConstSpan>& spans) override {
    std::vector<k::GradBuffer> buffers;
    for (const auto& span : spans) {
      if (span.size > 0) buffers.push_back({span.data, span.size});
    }
    if (buffers.empty()) return 0;
    kc::DeviceBuffer<double> result = kc::allocate<double>(ctx_, 1);
    kc::grad_norm_squared(ctx_, buffers.data(), static_cast<std::int64_t>(buffers.size()), result.data());
    double out = 0;
    kc::copy_to_host(ctx_, &out, result.data(), sizeof(double));
    return out;
  }
  void cross_entropy_loss(std::int64_t tokens, const float* max, const float* sum_exp, const float* target_logit,
                          float* loss) override {
    kc::cross_entropy_loss(ctx_, tokens, max, sum_exp, target_logit, loss, nullptr);
  }
  void adamw_step(const k::AdamWConfig& config, const k::AdamWBuffer* buffers, std::int64_t count) override {
    kc::adamw_step(ctx_, config, buffers, count);
  }

  Kernels<bf16>* bf16_kernels() override { return this; }

  // ---- ordering with NCCL's streams ----
  void order_before(comm::Communicator& comm) override {
    link(stream(), static_cast<cudaStream_t>(comm::nccl_stream(comm)));
  }
  void order_after(comm::Communicator& comm) override {
    link(static_cast<cudaStream_t>(comm::nccl_stream(comm)), stream());
  }

  // ---- Kernels<bf16> ----
  void from_fp32(std::int64_t n, const float* x, bf16* y) override { kc::cast_fp32_to_bf16(ctx_, n, x, y); }
  void add_bias_rows(std::int64_t rows, std::int64_t cols, const bf16* bias, bf16* x) override {
    kc::bias_add(ctx_, rows, cols, bias, x);
  }
  void accumulate_bias_grad(std::int64_t rows, std::int64_t cols, const bf16* dy, float* dbias) override {
    kc::bias_grad(ctx_, rows, cols, dy, dbias);
  }

  void linear_forward(const k::LinearShape& s, const bf16* x, const bf16* w, const bf16* b, bf16* y) override {
    kc::linear_forward(ctx_, s, x, w, b, y);
  }
  void linear_backward_input(const k::LinearShape& s, const bf16* dy, const bf16* w, bf16* dx) override {
    kc::linear_backward_input(ctx_, s, dy, w, dx);
  }
  void linear_backward_weight(const k::LinearShape& s, const bf16* dy, const bf16* x, float* dw, float* db) override {
    kc::linear_backward_weight(ctx_, s, dy, x, dw, db);
  }

  void layernorm_forward(const k::NormShape& s, const bf16* x, const float* gamma, const float* beta, float eps,
                         bf16* y, float* mean, float* rstd) override {
    kc::layernorm_forward(ctx_, s, x, gamma, beta, eps, y, mean, rstd);
  }
  void layernorm_backward(const k::NormShape& s, const bf16* x, const float* gamma, const float* mean,
                          const float* rstd, const bf16* dy, bf16* dx, float* dgamma, float* dbeta) override {
    kc::layernorm_backward(ctx_, s, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
  }
  void rmsnorm_forward(const k::NormShape& s, const bf16* x, const float* gamma, float eps, bf16* y,
                       float* rstd) override {
    kc::rmsnorm_forward(ctx_, s, x, gamma, eps, y, rstd);
  }
  void rmsnorm_backward(const k::NormShape& s, const bf16* x, const float* gamma, const float* rstd, const bf16* dy,
                        bf16* dx, float* dgamma) override {
    kc::rmsnorm_backward(ctx_, s, x, gamma, rstd, dy, dx, dgamma);
  }

  void embedding_forward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const bf16* table,
                         k::VocabShard shard, bf16* out) override {
    kc::embedding_forward(ctx_, tokens, hidden, ids, table, shard, out);
  }
  void embedding_backward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const bf16* dout,
                          k::VocabShard shard, float* dtable) override {
    kc::embedding_backward(ctx_, tokens, hidden, ids, dout, shard, dtable);
  }
  void position_embedding_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const bf16* pos,
                                  bf16* x) override {
    kc::position_embedding_forward(ctx_, batch, seq, hidden, pos, x);
  }
  void position_embedding_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const bf16* dx,
                                   float* dpos) override {
    kc::position_embedding_backward(ctx_, batch, seq, hidden, dx, dpos);
  }

  void dropout_add_forward(const k::HiddenLayout& layout, const bf16* x, const bf16* residual, float p,
                           const k::DropoutKey& key, bf16* out) override {
    kc::dropout_add_forward(ctx_, layout, x, residual, p, key, out);
  }
  void dropout_add_backward(const k::HiddenLayout& layout, const bf16* dout, float p, const k::DropoutKey& key,
                            bf16* dx) override {
    kc::dropout_add_backward(ctx_, layout, dout, p, key, dx);
  }
  void residual_add(std::int64_t n, const bf16* a, const bf16* b, bf16* out) override {
    kc::residual_add(ctx_, n, a, b, out);
  }

  void gelu_forward(std::int64_t n, const bf16* x, bf16* y) override { kc::gelu_forward(ctx_, n, x, y); }
  void gelu_backward(std::int64_t n, const bf16* x, const bf16* dy, bf16* dx) override {
    kc::gelu_backward(ctx_, n, x, dy, dx);
  }
  void swiglu_forward(std::int64_t tokens, std::int64_t ffn, const bf16* gate_up, bf16* y) override {
    kc::swiglu_forward(ctx_, tokens, ffn, gate_up, y);
  }
  void swiglu_backward(std::int64_t tokens, std::int64_t ffn, const bf16* gate_up, const bf16* dy,
                       bf16* dgate_up) override {
    kc::swiglu_backward(ctx_, tokens, ffn, gate_up, dy, dgate_up);
  }

  void rope_forward(const k::RopeShape& s, const float* cos, const float* sin, bf16* x) override {
    kc::rope_forward(ctx_, s, cos, sin, x);
  }
  void rope_backward(const k::RopeShape& s, const float* cos, const float* sin, bf16* dx) override {
    kc::rope_backward(ctx_, s, cos, sin, dx);
  }

  void attention_forward(const k::AttentionShape& s, const bf16* q, const bf16* kk, const bf16* v, bf16* o, float* lse,
                         const k::AttentionDropout* dropout) override {
    whole_sequences(s);
    kc::attention_forward(ctx_, s, q, kk, v, o, lse, dropout);
  }
  void attention_backward(const k::AttentionShape& s, const bf16* q, const bf16* kk, const bf16* v, const bf16* o,
                          const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                          const k::AttentionDropout* dropout) override {
    whole_sequences(s);
    kc::attention_backward(ctx_, s, q, kk, v, o, lse, dout, dq, dk, dv, dropout);
  }
  // The fused kernels attend whole sequences; context parallelism's chunks run on the CPU backend only (the
  // interpreter refuses cp > 1 on a device backend before any pass).
  static void whole_sequences(const k::AttentionShape& s) {
    DTRAIN_CHECK(s.q_rows == 0 && s.q_offset == 0, "the CUDA attention kernels run whole sequences, not cp chunks");
  }

  void cross_entropy_max(std::int64_t tokens, const bf16* logits, k::VocabShard shard, float* max) override {
    kc::cross_entropy_max(ctx_, tokens, logits, shard, max);
  }
  void cross_entropy_sum_exp(std::int64_t tokens, const bf16* logits, const std::int32_t* targets, k::VocabShard shard,
                             const float* max, float* sum_exp, float* target_logit) override {
    kc::cross_entropy_sum_exp(ctx_, tokens, logits, targets, shard, max, sum_exp, target_logit);
  }
  void cross_entropy_backward(std::int64_t tokens, const bf16* logits, const std::int32_t* targets, k::VocabShard shard,
                              const float* max, const float* sum_exp, const float* dloss, bf16* dlogits) override {
    kc::cross_entropy_backward(ctx_, tokens, logits, targets, shard, max, sum_exp, dloss, dlogits);
  }

  void grouped_linear_forward(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                              const bf16* x, const bf16* const* weights, bf16* y) override {
    kc::grouped_linear_forward(ctx_, groups, rows, in, out, x, weights, y);
  }
  void grouped_linear_backward_input(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                                     const bf16* dy, const bf16* const* weights, bf16* dx) override {
    kc::grouped_linear_backward_input(ctx_, groups, rows, in, out, dy, weights, dx);
  }
  void grouped_linear_backward_weight(std::int64_t groups, const std::int64_t* rows, std::int64_t in, std::int64_t out,
                                      const bf16* dy, const bf16* x, float* const* dweights) override {
    kc::grouped_linear_backward_weight(ctx_, groups, rows, in, out, dy, x, dweights);
  }

  void moe_route(const k::MoeRouteShape& shape, const bf16* logits, float* probs, std::int32_t* expert,
                 float* gate) override {
    kc::moe_route(ctx_, shape, logits, probs, expert, gate);
  }
  void moe_route_backward(const k::MoeRouteShape& shape, const float* probs, const std::int32_t* expert,
                          const float* dgate, const float* aux_grad, std::int64_t seq_len, bf16* dlogits) override {
    kc::moe_route_backward(ctx_, shape, probs, expert, dgate, aux_grad, seq_len, dlogits);
  }
  void moe_gather_rows(std::int64_t n, std::int64_t cols, const bf16* src, const std::int32_t* rows,
                       bf16* dst) override {
    kc::moe_gather_rows(ctx_, n, cols, src, rows, dst);
  }
  void moe_unpermute(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const bf16* src,
                     const std::int32_t* slot, const float* weight, bool accumulate, bf16* out) override {
    kc::moe_unpermute(ctx_, tokens, top_k, cols, src, slot, weight, accumulate, out);
  }
  void moe_unpermute_backward(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const bf16* dout,
                              const bf16* src, const std::int32_t* slot, const float* gate, bf16* dsrc,
                              float* dgate) override {
    kc::moe_unpermute_backward(ctx_, tokens, top_k, cols, dout, src, slot, gate, dsrc, dgate);
  }
  void moe_sigmoid_gate(std::int64_t tokens, const bf16* z, float* g) override {
    kc::moe_sigmoid_gate(ctx_, tokens, z, g);
  }
  void moe_sigmoid_gate_backward(std::int64_t tokens, const float* g, const float* dg, bf16* dz) override {
    kc::moe_sigmoid_gate_backward(ctx_, tokens, g, dg, dz);
  }

 private:
  static kc::ContextOptions options(int device) {
    kc::ContextOptions o = kc::ContextOptions::from_environment();
    o.device = device;
    return o;
  }
  cudaStream_t stream() { return static_cast<cudaStream_t>(ctx_.stream()); }

  // Work queued on `consumer` from now on waits for the work queued on `producer` so far. The event is destroyed at
  // once: CUDA releases it when the wait no longer needs it.
  static void link(cudaStream_t producer, cudaStream_t consumer) {
    if (producer == consumer) return;
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cudaError_t status = cudaEventRecord(event, producer);
    if (status == cudaSuccess) status = cudaStreamWaitEvent(consumer, event, 0);
    cudaEventDestroy(event);
    check(status, "cudaEventRecord/cudaStreamWaitEvent");
  }

  kc::Context ctx_;
};

}  // namespace

namespace detail {
kernels::cuda::Context* cuda_context(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda != nullptr ? &cuda->context() : nullptr;
}
}  // namespace detail

bool cuda_backend_built() { return true; }

std::string cuda_backend_unavailable_reason(int device) { return kc::device_unavailable_reason(device); }

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why = cuda_backend_unavailable_reason(device);
  if (!why.empty()) throw input_error(fmt::format("--device cuda: {}", why));
  return std::make_unique<CudaBackend>(device);
}

}  // namespace dtrain::exec
