// The CPU backend: host memory and the fp32 kernels of dtrain::kernels::cpu, so that the interpreter computes exactly
// what it computed when it called them directly. The element-wise work keeps the loops it replaced (same order, same
// accumulator types): the executor's results are compared bit-for-bit across layouts and against PyTorch.
#include <cstring>
#include <new>

#include "dtrain/exec/backend.h"
#include "dtrain/kernels/activation.h"
#include "dtrain/kernels/attention.h"
#include "dtrain/kernels/cross_entropy.h"
#include "dtrain/kernels/dropout.h"
#include "dtrain/kernels/embedding.h"
#include "dtrain/kernels/linear.h"
#include "dtrain/kernels/norm.h"
#include "dtrain/kernels/optimizer.h"
#include "dtrain/kernels/rope.h"

namespace dtrain::exec {

namespace {

namespace k = dtrain::kernels;
namespace kc = dtrain::kernels::cpu;

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  bool host_accessible() const override { return true; }

  // operator new, as std::allocator: the same alignment the kernels saw when the tensors were std::vectors.
  void* allocate(std::size_t bytes) override {
    void* p = ::operator new(bytes);
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* ptr, std::size_t) noexcept override { ::operator delete(ptr); }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void copy_to_backend(void* dst, const void* host_src, std::size_t bytes) override { copy(dst, host_src, bytes); }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override { copy(host_dst, src, bytes); }
  void fill(std::int64_t n, float value, float* x) override {
    for (std::int64_t i = 0; i < n; ++i) x[i] = value;
  }

  void add_bias_rows(std::int64_t rows, std::int64_t cols, const float* bias, float* x) override {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < cols; ++j) x[r * cols + j] += bias[j];
    }
  }
  void accumulate_bias_grad(std::int64_t rows, std::int64_t cols, const float* dy, float* dbias) override {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < cols; ++j) dbias[j] += dy[r * cols + j];
    }
  }
  double sum(std::int64_t n, const float* x) override {
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += x[i];
    return s;
  }
  double sum_squares(const std::vector<ConstSpan>& spans) override {
    double s = 0;
    for (const auto& span : spans) {
      for (std::int64_t i = 0; i < span.size; ++i) s += static_cast<double>(span.data[i]) * span.data[i];
    }
    return s;
  }

  void linear_forward(const k::LinearShape& shape, const float* x, const float* weight, const float* bias,
                      float* y) override {
    kc::linear_forward(shape, x, weight, bias, y);
  }
  void linear_backward_input(const k::LinearShape& shape, const float* dy, const float* weight, float* dx) override {
    kc::linear_backward_input(shape, dy, weight, dx);
  }
  void linear_backward_weight(const k::LinearShape& shape, const float* dy, const float* x, float* dweight,
                              float* dbias) override {
    kc::linear_backward_weight(shape, dy, x, dweight, dbias);
  }

  void layernorm_forward(const k::NormShape& shape, const float* x, const float* gamma, const float* beta, float eps,
                         float* y, float* mean, float* rstd) override {
    kc::layernorm_forward(shape, x, gamma, beta, eps, y, mean, rstd);
  }
  void layernorm_backward(const k::NormShape& shape, const float* x, const float* gamma, const float* mean,
                          const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) override {
    kc::layernorm_backward(shape, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
  }
  void rmsnorm_forward(const k::NormShape& shape, const float* x, const float* gamma, float eps, float* y,
                       float* rstd) override {
    kc::rmsnorm_forward(shape, x, gamma, eps, y, rstd);
  }
  void rmsnorm_backward(const k::NormShape& shape, const float* x, const float* gamma, const float* rstd,
                        const float* dy, float* dx, float* dgamma) override {
    kc::rmsnorm_backward(shape, x, gamma, rstd, dy, dx, dgamma);
  }

  void embedding_forward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const float* table,
                         k::VocabShard shard, float* out) override {
    kc::embedding_forward(tokens, hidden, ids, table, shard, out);
  }
  void embedding_backward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const float* dout,
                          k::VocabShard shard, float* dtable) override {
    kc::embedding_backward(tokens, hidden, ids, dout, shard, dtable);
  }
  void position_embedding_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const float* pos,
                                  float* x) override {
    kc::position_embedding_forward(batch, seq, hidden, pos, x);
  }
  void position_embedding_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const float* dx,
                                   float* dpos) override {
    kc::position_embedding_backward(batch, seq, hidden, dx, dpos);
  }

  void dropout_add_forward(const k::HiddenLayout& layout, const float* x, const float* residual, float p,
                           const k::DropoutKey& key, float* out) override {
    kc::dropout_add_forward(layout, x, residual, p, key, out);
  }
  void dropout_add_backward(const k::HiddenLayout& layout, const float* dout, float p, const k::DropoutKey& key,
                            float* dx) override {
    kc::dropout_add_backward(layout, dout, p, key, dx);
  }
  void residual_add(std::int64_t n, const float* a, const float* b, float* out) override {
    kc::residual_add(n, a, b, out);
  }

  void gelu_forward(std::int64_t n, const float* x, float* y) override { kc::gelu_forward(n, x, y); }
  void gelu_backward(std::int64_t n, const float* x, const float* dy, float* dx) override {
    kc::gelu_backward(n, x, dy, dx);
  }
  void swiglu_forward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, float* y) override {
    kc::swiglu_forward(tokens, ffn, gate_up, y);
  }
  void swiglu_backward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, const float* dy,
                       float* dgate_up) override {
    kc::swiglu_backward(tokens, ffn, gate_up, dy, dgate_up);
  }

  void rope_forward(const k::RopeShape& shape, const float* cos, const float* sin, float* x) override {
    kc::rope_forward(shape, cos, sin, x);
  }
  void rope_backward(const k::RopeShape& shape, const float* cos, const float* sin, float* dx) override {
    kc::rope_backward(shape, cos, sin, dx);
  }

  void attention_forward(const k::AttentionShape& shape, const float* q, const float* kk, const float* v, float* o,
                         float* lse, const k::AttentionDropout* dropout) override {
    kc::attention_forward(shape, q, kk, v, o, lse, dropout);
  }
  void attention_backward(const k::AttentionShape& shape, const float* q, const float* kk, const float* v,
                          const float* o, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                          const k::AttentionDropout* dropout) override {
    kc::attention_backward(shape, q, kk, v, o, lse, dout, dq, dk, dv, dropout);
  }

  void cross_entropy_max(std::int64_t tokens, const float* logits, k::VocabShard shard, float* max) override {
    kc::cross_entropy_max(tokens, logits, shard, max);
  }
  void cross_entropy_sum_exp(std::int64_t tokens, const float* logits, const std::int32_t* targets,
                             k::VocabShard shard, const float* max, float* sum_exp, float* target_logit) override {
    kc::cross_entropy_sum_exp(tokens, logits, targets, shard, max, sum_exp, target_logit);
  }
  void cross_entropy_loss(std::int64_t tokens, const float* max, const float* sum_exp, const float* target_logit,
                          float* loss) override {
    kc::cross_entropy_loss(tokens, max, sum_exp, target_logit, loss);
  }
  void cross_entropy_backward(std::int64_t tokens, const float* logits, const std::int32_t* targets,
                              k::VocabShard shard, const float* max, const float* sum_exp, const float* dloss,
                              float* dlogits) override {
    kc::cross_entropy_backward(tokens, logits, targets, shard, max, sum_exp, dloss, dlogits);
  }

  void adamw_step(const k::AdamWConfig& config, const k::AdamWBuffer* buffers, std::int64_t count) override {
    kc::adamw_step(config, buffers, count);
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace dtrain::exec
