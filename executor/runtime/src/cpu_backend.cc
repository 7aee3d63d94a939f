// The CPU backend: host memory and the fp32 kernels of dtrain::kernels::cpu, so that the interpreter computes exactly
// what it computed when it called them directly; and bf16 kernels that emulate the CUDA backend's numerics on top of
// them. The element-wise work keeps the loops it replaced (same order, same
// accumulator types): the executor's results are compared bit-for-bit across layouts and against PyTorch.
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/exec/backend.h"
#include "dtrain/kernels/activation.h"
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

namespace {

namespace k = dtrain::kernels;
namespace kcpu = dtrain::kernels::cpu;

// The fp32 kernels: dtrain::kernels::cpu as they are.
class CpuFp32Kernels final : public Kernels<float> {
 public:
  void from_fp32(std::int64_t n, const float* x, float* y) override {
    if (n > 0 && x != y) std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(float));
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
  void linear_forward(const k::LinearShape& shape, const float* x, const float* weight, const float* bias,
                      float* y) override {
    kcpu::linear_forward(shape, x, weight, bias, y);
  }
  void linear_backward_input(const k::LinearShape& shape, const float* dy, const float* weight, float* dx) override {
    kcpu::linear_backward_input(shape, dy, weight, dx);
  }
  void linear_backward_weight(const k::LinearShape& shape, const float* dy, const float* x, float* dweight,
                              float* dbias) override {
    kcpu::linear_backward_weight(shape, dy, x, dweight, dbias);
  }

  void layernorm_forward(const k::NormShape& shape, const float* x, const float* gamma, const float* beta, float eps,
                         float* y, float* mean, float* rstd) override {
    kcpu::layernorm_forward(shape, x, gamma, beta, eps, y, mean, rstd);
  }
  void layernorm_backward(const k::NormShape& shape, const float* x, const float* gamma, const float* mean,
                          const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) override {
    kcpu::layernorm_backward(shape, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
  }
  void rmsnorm_forward(const k::NormShape& shape, const float* x, const float* gamma, float eps, float* y,
                       float* rstd) override {
    kcpu::rmsnorm_forward(shape, x, gamma, eps, y, rstd);
  }
  void rmsnorm_backward(const k::NormShape& shape, const float* x, const float* gamma, const float* rstd,
                        const float* dy, float* dx, float* dgamma) override {
    kcpu::rmsnorm_backward(shape, x, gamma, rstd, dy, dx, dgamma);
  }

  void embedding_forward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const float* table,
                         k::VocabShard shard, float* out) override {
    kcpu::embedding_forward(tokens, hidden, ids, table, shard, out);
  }
  void embedding_backward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const float* dout,
                          k::VocabShard shard, float* dtable) override {
    kcpu::embedding_backward(tokens, hidden, ids, dout, shard, dtable);
  }
  void position_embedding_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const float* pos,
                                  float* x) override {
    kcpu::position_embedding_forward(batch, seq, hidden, pos, x);
  }
  void position_embedding_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const float* dx,
                                   float* dpos) override {
    kcpu::position_embedding_backward(batch, seq, hidden, dx, dpos);
  }

  void dropout_add_forward(const k::HiddenLayout& layout, const float* x, const float* residual, float p,
                           const k::DropoutKey& key, float* out) override {
    kcpu::dropout_add_forward(layout, x, residual, p, key, out);
  }
  void dropout_add_backward(const k::HiddenLayout& layout, const float* dout, float p, const k::DropoutKey& key,
                            float* dx) override {
    kcpu::dropout_add_backward(layout, dout, p, key, dx);
  }
  void residual_add(std::int64_t n, const float* a, const float* b, float* out) override {
    kcpu::residual_add(n, a, b, out);
  }

  void gelu_forward(std::int64_t n, const float* x, float* y) override { kcpu::gelu_forward(n, x, y); }
  void gelu_backward(std::int64_t n, const float* x, const float* dy, float* dx) override {
    kcpu::gelu_backward(n, x, dy, dx);
  }
  void swiglu_forward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, float* y) override {
    kcpu::swiglu_forward(tokens, ffn, gate_up, y);
  }
  void swiglu_backward(std::int64_t tokens, std::int64_t ffn, const float* gate_up, const float* dy,
                       float* dgate_up) override {
    kcpu::swiglu_backward(tokens, ffn, gate_up, dy, dgate_up);
  }

  void rope_forward(const k::RopeShape& shape, const float* cos, const float* sin, float* x) override {
    kcpu::rope_forward(shape, cos, sin, x);
  }
  void rope_backward(const k::RopeShape& shape, const float* cos, const float* sin, float* dx) override {
    kcpu::rope_backward(shape, cos, sin, dx);
  }

  void attention_forward(const k::AttentionShape& shape, const float* q, const float* kk, const float* v, float* o,
                         float* lse, const k::AttentionDropout* dropout) override {
    kcpu::attention_forward(shape, q, kk, v, o, lse, dropout);
  }
  void attention_backward(const k::AttentionShape& shape, const float* q, const float* kk, const float* v,
                          const float* o, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                          const k::AttentionDropout* dropout) override {
    kcpu::attention_backward(shape, q, kk, v, o, lse, dout, dq, dk, dv, dropout);
  }

  void cross_entropy_max(std::int64_t tokens, const float* logits, k::VocabShard shard, float* max) override {
    kcpu::cross_entropy_max(tokens, logits, shard, max);
  }
  void cross_entropy_sum_exp(std::int64_t tokens, const float* logits, const std::int32_t* targets, k::VocabShard shard,
                             const float* max, float* sum_exp, float* target_logit) override {
    kcpu::cross_entropy_sum_exp(tokens, logits, targets, shard, max, sum_exp, target_logit);
  }
  void cross_entropy_backward(std::int64_t tokens, const float* logits, const std::int32_t* targets,
                              k::VocabShard shard, const float* max, const float* sum_exp, const float* dloss,
                              float* dlogits) override {
    kcpu::cross_entropy_backward(tokens, logits, targets, shard, max, sum_exp, dloss, dlogits);
  }

  void moe_route(const k::MoeRouteShape& shape, const float* logits, float* probs, std::int32_t* expert,
                 float* gate) override {
    kcpu::moe_route(shape, logits, probs, expert, gate);
  }
  void moe_route_backward(const k::MoeRouteShape& shape, const float* probs, const std::int32_t* expert,
                          const float* dgate, const float* aux_grad, std::int64_t seq_len, float* dlogits) override {
    kcpu::moe_route_backward(shape, probs, expert, dgate, aux_grad, seq_len, dlogits);
  }
  void moe_gather_rows(std::int64_t n, std::int64_t cols, const float* src, const std::int32_t* rows,
                       float* dst) override {
    kcpu::moe_gather_rows(n, cols, src, rows, dst);
  }
  void moe_unpermute(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const float* src,
                     const std::int32_t* slot, const float* weight, bool accumulate, float* out) override {
    kcpu::moe_unpermute(tokens, top_k, cols, src, slot, weight, accumulate, out);
  }
  void moe_unpermute_backward(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const float* dout,
                              const float* src, const std::int32_t* slot, const float* gate, float* dsrc,
                              float* dgate) override {
    kcpu::moe_unpermute_backward(tokens, top_k, cols, dout, src, slot, gate, dsrc, dgate);
  }
  void moe_sigmoid_gate(std::int64_t tokens, const float* z, float* g) override {
    kcpu::moe_sigmoid_gate(tokens, z, g);
  }
  void moe_sigmoid_gate_backward(std::int64_t tokens, const float* g, const float* dg, float* dz) override {
    kcpu::moe_sigmoid_gate_backward(tokens, g, dg, dz);
  }
};

// The bf16 kernels: each call widens its bf16 inputs to fp32 (exact), runs the fp32 kernel and rounds every bf16
// output once (to nearest, ties to even). That is the contract of the CUDA kernels (compute in fp32, round the
// output once), so this is the host reference for mixed-precision runs. It costs a temporary fp32 copy of every
// operand: for tests and CPU runs of bf16 numerics, not for speed.
class CpuBf16Kernels final : public Kernels<bf16> {
 public:
  void from_fp32(std::int64_t n, const float* x, bf16* y) override { narrow(x, n, y); }
  void add_bias_rows(std::int64_t rows, std::int64_t cols, const bf16* bias, bf16* x) override {
    Wide wx = widen(x, rows * cols), wb = widen(bias, cols);
    fp32_.add_bias_rows(rows, cols, wb.data(), wx.data());
    narrow(wx, x);
  }
  void accumulate_bias_grad(std::int64_t rows, std::int64_t cols, const bf16* dy, float* dbias) override {
    fp32_.accumulate_bias_grad(rows, cols, widen(dy, rows * cols).data(), dbias);
  }

  void linear_forward(const k::LinearShape& s, const bf16* x, const bf16* weight, const bf16* bias, bf16* y) override {
    Wide wy(static_cast<std::size_t>(s.tokens * s.out_features));
    Wide wb = widen(bias, s.out_features);
    kcpu::linear_forward(s, widen(x, s.tokens * s.in_features).data(),
                         widen(weight, s.out_features * s.in_features).data(), bias ? wb.data() : nullptr, wy.data());
    narrow(wy, y);
  }
  void linear_backward_input(const k::LinearShape& s, const bf16* dy, const bf16* weight, bf16* dx) override {
    Wide wdx(static_cast<std::size_t>(s.tokens * s.in_features));
    kcpu::linear_backward_input(s, widen(dy, s.tokens * s.out_features).data(),
                                widen(weight, s.out_features * s.in_features).data(), wdx.data());
    narrow(wdx, dx);
  }
  void linear_backward_weight(const k::LinearShape& s, const bf16* dy, const bf16* x, float* dweight,
                              float* dbias) override {
    kcpu::linear_backward_weight(s, widen(dy, s.tokens * s.out_features).data(),
                                 widen(x, s.tokens * s.in_features).data(), dweight, dbias);
  }

  void layernorm_forward(const k::NormShape& s, const bf16* x, const float* gamma, const float* beta, float eps,
                         bf16* y, float* mean, float* rstd) override {
    Wide wy(static_cast<std::size_t>(s.rows * s.hidden));
    kcpu::layernorm_forward(s, widen(x, s.rows * s.hidden).data(), gamma, beta, eps, wy.data(), mean, rstd);
    narrow(wy, y);
  }
  void layernorm_backward(const k::NormShape& s, const bf16* x, const float* gamma, const float* mean,
                          const float* rstd, const bf16* dy, bf16* dx, float* dgamma, float* dbeta) override {
    Wide wdx(static_cast<std::size_t>(s.rows * s.hidden));
    kcpu::layernorm_backward(s, widen(x, s.rows * s.hidden).data(), gamma, mean, rstd,
                             widen(dy, s.rows * s.hidden).data(), wdx.data(), dgamma, dbeta);
    narrow(wdx, dx);
  }
  void rmsnorm_forward(const k::NormShape& s, const bf16* x, const float* gamma, float eps, bf16* y,
                       float* rstd) override {
    Wide wy(static_cast<std::size_t>(s.rows * s.hidden));
    kcpu::rmsnorm_forward(s, widen(x, s.rows * s.hidden).data(), gamma, eps, wy.data(), rstd);
    narrow(wy, y);
  }
  void rmsnorm_backward(const k::NormShape& s, const bf16* x, const float* gamma, const float* rstd, const bf16* dy,
                        bf16* dx, float* dgamma) override {
    Wide wdx(static_cast<std::size_t>(s.rows * s.hidden));
    kcpu::rmsnorm_backward(s, widen(x, s.rows * s.hidden).data(), gamma, rstd, widen(dy, s.rows * s.hidden).data(),
                           wdx.data(), dgamma);
    narrow(wdx, dx);
  }

  void embedding_forward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const bf16* table,
                         k::VocabShard shard, bf16* out) override {
    Wide wo(static_cast<std::size_t>(tokens * hidden));
    kcpu::embedding_forward(tokens, hidden, ids, widen(table, (shard.end - shard.begin) * hidden).data(), shard,
                            wo.data());
    narrow(wo, out);
  }
  void embedding_backward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const bf16* dout,
                          k::VocabShard shard, float* dtable) override {
    kcpu::embedding_backward(tokens, hidden, ids, widen(dout, tokens * hidden).data(), shard, dtable);
  }
  void position_embedding_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const bf16* pos,
                                  bf16* x) override {
    Wide wx = widen(x, batch * seq * hidden);
    kcpu::position_embedding_forward(batch, seq, hidden, widen(pos, seq * hidden).data(), wx.data());
    narrow(wx, x);
  }
  void position_embedding_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const bf16* dx,
                                   float* dpos) override {
    kcpu::position_embedding_backward(batch, seq, hidden, widen(dx, batch * seq * hidden).data(), dpos);
  }

  void dropout_add_forward(const k::HiddenLayout& layout, const bf16* x, const bf16* residual, float p,
                           const k::DropoutKey& key, bf16* out) override {
    const std::int64_t n = layout.batch * layout.seq * layout.hidden;
    Wide wx = widen(x, n), wr = widen(residual, n), wo(static_cast<std::size_t>(n));
    kcpu::dropout_add_forward(layout, wx.data(), residual ? wr.data() : nullptr, p, key, wo.data());
    narrow(wo, out);
  }
  void dropout_add_backward(const k::HiddenLayout& layout, const bf16* dout, float p, const k::DropoutKey& key,
                            bf16* dx) override {
    const std::int64_t n = layout.batch * layout.seq * layout.hidden;
    Wide w = widen(dout, n);
    kcpu::dropout_add_backward(layout, w.data(), p, key, w.data());
    narrow(w, dx);
  }
  void residual_add(std::int64_t n, const bf16* a, const bf16* b, bf16* out) override {
    Wide wa = widen(a, n);
    kcpu::residual_add(n, wa.data(), widen(b, n).data(), wa.data());
    narrow(wa, out);
  }

  void gelu_forward(std::int64_t n, const bf16* x, bf16* y) override {
    Wide wy(static_cast<std::size_t>(n));
    kcpu::gelu_forward(n, widen(x, n).data(), wy.data());
    narrow(wy, y);
  }
  void gelu_backward(std::int64_t n, const bf16* x, const bf16* dy, bf16* dx) override {
    Wide wdx(static_cast<std::size_t>(n));
    kcpu::gelu_backward(n, widen(x, n).data(), widen(dy, n).data(), wdx.data());
    narrow(wdx, dx);
  }
  void swiglu_forward(std::int64_t tokens, std::int64_t ffn, const bf16* gate_up, bf16* y) override {
    Wide wy(static_cast<std::size_t>(tokens * ffn));
    kcpu::swiglu_forward(tokens, ffn, widen(gate_up, tokens * 2 * ffn).data(), wy.data());
    narrow(wy, y);
  }
  void swiglu_backward(std::int64_t tokens, std::int64_t ffn, const bf16* gate_up, const bf16* dy,
                       bf16* dgate_up) override {
    Wide wd(static_cast<std::size_t>(tokens * 2 * ffn));
    kcpu::swiglu_backward(tokens, ffn, widen(gate_up, tokens * 2 * ffn).data(), widen(dy, tokens * ffn).data(),
                          wd.data());
    narrow(wd, dgate_up);
  }

  // The heads sit at a row stride inside the fused QKV activation: only they are read and written back.
  void rope_forward(const k::RopeShape& s, const float* cos, const float* sin, bf16* x) override {
    const std::int64_t rows = s.batch * s.seq, cols = s.n_heads * s.head_dim;
    Wide w = widen_rows(x, rows, cols, s.row_stride);
    kcpu::rope_forward(s, cos, sin, w.data());
    narrow_rows(w.data(), rows, cols, s.row_stride, x);
  }
  void rope_backward(const k::RopeShape& s, const float* cos, const float* sin, bf16* dx) override {
    const std::int64_t rows = s.batch * s.seq, cols = s.n_heads * s.head_dim;
    Wide w = widen_rows(dx, rows, cols, s.row_stride);
    kcpu::rope_backward(s, cos, sin, w.data());
    narrow_rows(w.data(), rows, cols, s.row_stride, dx);
  }

  void attention_forward(const k::AttentionShape& s, const bf16* q, const bf16* kk, const bf16* v, bf16* o, float* lse,
                         const k::AttentionDropout* dropout) override {
    const std::int64_t rows = s.batch * s.query_rows(), keys = s.batch * s.seq;
    const std::int64_t qc = s.n_heads * s.head_dim, kvc = s.n_kv_heads * s.head_dim;
    Wide wo(static_cast<std::size_t>(rows * qc));
    kcpu::attention_forward(s, widen_rows(q, rows, qc, s.q_stride).data(),
                            widen_rows(kk, keys, kvc, s.kv_stride).data(), widen_rows(v, keys, kvc, s.kv_stride).data(),
                            wo.data(), lse, dropout);
    narrow(wo, o);
  }
  void attention_backward(const k::AttentionShape& s, const bf16* q, const bf16* kk, const bf16* v, const bf16* o,
                          const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                          const k::AttentionDropout* dropout) override {
    const std::int64_t rows = s.batch * s.query_rows(), keys = s.batch * s.seq;
    const std::int64_t qc = s.n_heads * s.head_dim, kvc = s.n_kv_heads * s.head_dim;
    Wide wdq(strided_size(rows, qc, s.q_stride)), wdk(strided_size(keys, kvc, s.kv_stride)), wdv(wdk.size());
    kcpu::attention_backward(s, widen_rows(q, rows, qc, s.q_stride).data(),
                             widen_rows(kk, keys, kvc, s.kv_stride).data(),
                             widen_rows(v, keys, kvc, s.kv_stride).data(), widen(o, rows * qc).data(), lse,
                             widen(dout, rows * qc).data(), wdq.data(), wdk.data(), wdv.data(), dropout);
    narrow_rows(wdq.data(), rows, qc, s.q_stride, dq);
    narrow_rows(wdk.data(), keys, kvc, s.kv_stride, dk);
    narrow_rows(wdv.data(), keys, kvc, s.kv_stride, dv);
  }

  void cross_entropy_max(std::int64_t tokens, const bf16* logits, k::VocabShard shard, float* max) override {
    kcpu::cross_entropy_max(tokens, widen(logits, tokens * (shard.end - shard.begin)).data(), shard, max);
  }
  void cross_entropy_sum_exp(std::int64_t tokens, const bf16* logits, const std::int32_t* targets, k::VocabShard shard,
                             const float* max, float* sum_exp, float* target_logit) override {
    kcpu::cross_entropy_sum_exp(tokens, widen(logits, tokens * (shard.end - shard.begin)).data(), targets, shard, max,
                                sum_exp, target_logit);
  }
  void cross_entropy_backward(std::int64_t tokens, const bf16* logits, const std::int32_t* targets, k::VocabShard shard,
                              const float* max, const float* sum_exp, const float* dloss, bf16* dlogits) override {
    Wide w = widen(logits, tokens * (shard.end - shard.begin));
    kcpu::cross_entropy_backward(tokens, w.data(), targets, shard, max, sum_exp, dloss, w.data());
    narrow(w, dlogits);
  }

  void moe_route(const k::MoeRouteShape& s, const bf16* logits, float* probs, std::int32_t* expert,
                 float* gate) override {
    kcpu::moe_route(s, widen(logits, s.tokens * s.experts).data(), probs, expert, gate);
  }
  void moe_route_backward(const k::MoeRouteShape& s, const float* probs, const std::int32_t* expert, const float* dgate,
                          const float* aux_grad, std::int64_t seq_len, bf16* dlogits) override {
    Wide w(static_cast<std::size_t>(s.tokens * s.experts));
    kcpu::moe_route_backward(s, probs, expert, dgate, aux_grad, seq_len, w.data());
    narrow(w, dlogits);
  }
  void moe_gather_rows(std::int64_t n, std::int64_t cols, const bf16* src, const std::int32_t* rows,
                       bf16* dst) override {
    // A copy: no rounding.
    for (std::int64_t i = 0; i < n; ++i) {
      std::memcpy(dst + i * cols, src + static_cast<std::int64_t>(rows[i]) * cols,
                  static_cast<std::size_t>(cols) * sizeof(bf16));
    }
  }
  void moe_unpermute(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const bf16* src,
                     const std::int32_t* slot, const float* weight, bool accumulate, bf16* out) override {
    const std::int64_t rows = rows_named(tokens * top_k, slot);
    Wide wo = accumulate ? widen(out, tokens * cols) : Wide(static_cast<std::size_t>(tokens * cols));
    kcpu::moe_unpermute(tokens, top_k, cols, widen(src, rows * cols).data(), slot, weight, accumulate, wo.data());
    narrow(wo, out);
  }
  void moe_unpermute_backward(std::int64_t tokens, std::int64_t top_k, std::int64_t cols, const bf16* dout,
                              const bf16* src, const std::int32_t* slot, const float* gate, bf16* dsrc,
                              float* dgate) override {
    const std::int64_t rows = rows_named(tokens * top_k, slot);
    Wide wd(static_cast<std::size_t>(rows * cols));
    kcpu::moe_unpermute_backward(tokens, top_k, cols, widen(dout, tokens * cols).data(), widen(src, rows * cols).data(),
                                 slot, gate, wd.data(), dgate);
    narrow(wd, dsrc);
  }
  void moe_sigmoid_gate(std::int64_t tokens, const bf16* z, float* g) override {
    kcpu::moe_sigmoid_gate(tokens, widen(z, tokens).data(), g);
  }
  void moe_sigmoid_gate_backward(std::int64_t tokens, const float* g, const float* dg, bf16* dz) override {
    Wide w(static_cast<std::size_t>(tokens));
    kcpu::moe_sigmoid_gate_backward(tokens, g, dg, w.data());
    narrow(w, dz);
  }

 private:
  using Wide = std::vector<float>;

  // n values (none for nullptr).
  static Wide widen(const bf16* x, std::int64_t n) {
    Wide w;
    if (x == nullptr) return w;
    w.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) w[static_cast<std::size_t>(i)] = from_bf16(x[i]);
    return w;
  }
  static void narrow(const float* x, std::int64_t n, bf16* y) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
  }
  static void narrow(const Wide& x, bf16* y) { narrow(x.data(), static_cast<std::int64_t>(x.size()), y); }
  // The permuted rows a slot table names (the rows of the buffer it indexes): one past the largest slot.
  static std::int64_t rows_named(std::int64_t n, const std::int32_t* slot) {
    std::int64_t rows = 0;
    for (std::int64_t i = 0; i < n; ++i) rows = std::max<std::int64_t>(rows, slot[i] + 1);
    return rows;
  }
  // Elements spanned by `rows` rows of `cols` values `stride` apart.
  static std::size_t strided_size(std::int64_t rows, std::int64_t cols, std::int64_t stride) {
    return rows == 0 ? 0 : static_cast<std::size_t>((rows - 1) * stride + cols);
  }
  // The same strided layout in fp32; the gaps between rows are 0.
  static Wide widen_rows(const bf16* x, std::int64_t rows, std::int64_t cols, std::int64_t stride) {
    Wide w(strided_size(rows, cols, stride), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < cols; ++j) {
        w[static_cast<std::size_t>(r * stride + j)] = from_bf16(x[r * stride + j]);
      }
    }
    return w;
  }
  static void narrow_rows(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t stride, bf16* y) {
    for (std::int64_t r = 0; r < rows; ++r) narrow(x + r * stride, cols, y + r * stride);
  }

  CpuFp32Kernels fp32_;
};

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  bool host_accessible() const override { return true; }

  void* allocate(std::size_t bytes) override { return take(bytes, 0); }
  void* allocate_uninitialized(std::size_t bytes) override { return take(bytes, 0xff); }
  void deallocate(void* ptr, std::size_t bytes) noexcept override {
    ::operator delete(ptr);
    in_use_.fetch_sub(static_cast<std::int64_t>(bytes));
  }
  MemoryUse memory_use() const override { return {in_use_.load(), peak_.load()}; }
  void reset_peak() override { peak_.store(in_use_.load()); }
  void release(void* x, std::size_t bytes) override {
    auto [first, last] = whole_pages(x, bytes);
    auto* begin = static_cast<std::uint8_t*>(x);
    if (first >= last) {
      std::memset(x, 0, bytes);
      return;
    }
    std::memset(begin, 0, static_cast<std::size_t>(first - begin));
    std::memset(last, 0, static_cast<std::size_t>(begin + bytes - last));
    // Private anonymous memory (operator new's) reads as zeros after MADV_DONTNEED, its pages given back.
    if (::madvise(first, static_cast<std::size_t>(last - first), MADV_DONTNEED) != 0) {
      throw internal_error(
          fmt::format("madvise(MADV_DONTNEED) of {} bytes failed: {}", last - first, std::strerror(errno)));
    }
    in_use_.fetch_sub(last - first);
  }
  void hold(void* x, std::size_t bytes) override {
    auto [first, last] = whole_pages(x, bytes);
    if (first < last) count_in(last - first);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void copy_to_backend(void* dst, const void* host_src, std::size_t bytes) override { copy(dst, host_src, bytes); }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override { copy(host_dst, src, bytes); }
  void fill(std::int64_t n, float value, float* x) override {
    for (std::int64_t i = 0; i < n; ++i) x[i] = value;
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

  void cross_entropy_loss(std::int64_t tokens, const float* max, const float* sum_exp, const float* target_logit,
                          float* loss) override {
    kcpu::cross_entropy_loss(tokens, max, sum_exp, target_logit, loss);
  }
  void adamw_step(const k::AdamWConfig& config, const k::AdamWBuffer* buffers, std::int64_t count) override {
    kcpu::adamw_step(config, buffers, count);
  }

  Kernels<float>* fp32_kernels() override { return &fp32_; }
  Kernels<bf16>* bf16_kernels() override { return &bf16_; }

 private:
  // `bytes` from operator new, as std::allocator (the same alignment the kernels saw when the tensors were
  // std::vectors), every byte set to `fill`.
  void* take(std::size_t bytes, int fill) {
    void* p = ::operator new(bytes);
    std::memset(p, fill, bytes);
    count_in(static_cast<std::int64_t>(bytes));
    return p;
  }
  void count_in(std::int64_t bytes) {
    const std::int64_t now = in_use_.fetch_add(bytes) + bytes;
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  // The memory pages wholly inside [x, x + bytes): [first, last), empty when first >= last.
  static std::pair<std::uint8_t*, std::uint8_t*> whole_pages(void* x, std::size_t bytes) {
    static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    auto* begin = static_cast<std::uint8_t*>(x);
    const auto at = reinterpret_cast<std::uintptr_t>(x);
    const std::uintptr_t up = (page - at % page) % page, down = (at + bytes) % page;  // to the page boundaries
    if (up + down >= bytes) return {begin, begin};
    return {begin + up, begin + bytes - down};
  }

  // One instance per process (cpu_backend()): ranks run as threads of one process share these counts.
  std::atomic<std::int64_t> in_use_{0};
  std::atomic<std::int64_t> peak_{0};
  CpuFp32Kernels fp32_;
  CpuBf16Kernels bf16_;
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace dtrain::exec
