// Float64 reference implementations of every kernel, written as plainly as the formulas in the kernel headers (no
// tiling, no online softmax, materialised attention matrices), plus the helpers the kernel tests share. The
// references are themselves checked against finite differences (reference_test.cc), so a kernel that matches them is
// matched against the mathematics, not against a second copy of its own algorithm.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "dtrain/kernels/dropout.h"
#include "dtrain/kernels/embedding.h"
#include "dtrain/kernels/threads.h"

namespace dtrain::kernels::testing {

using Vec = std::vector<double>;
using FVec = std::vector<float>;
using IVec = std::vector<std::int32_t>;

// Inputs for every test come from this generator with a fixed seed per test.
std::mt19937_64 make_rng(std::uint64_t seed);
// n samples of N(0, stddev^2), rounded to float.
FVec random_floats(std::mt19937_64& rng, std::size_t n, double stddev = 1.0);
IVec random_ids(std::mt19937_64& rng, std::size_t n, std::int32_t vocab);
Vec to_double(const FVec& x);
FVec to_float(const Vec& x);

// ||out - ref|| / ||ref|| (2-norms; ||out - ref|| when ref is 0).
double rel_error(const FVec& out, const Vec& ref);
// rel_error of a kernel output against its float64 reference, also recorded: at the end of the run the test
// program prints the worst value seen in each test suite (the accuracy report of every op).
double ref_error(const FVec& out, const Vec& ref);
// Bitwise equality of two float buffers.
bool bitwise_equal(const FVec& a, const FVec& b);

// The rel_error bound every kernel output and gradient must meet against its float64 reference. fp32 has a unit
// roundoff of 6e-8; the longest sums in the tests (a few thousand terms) and the 2-ulp exponential stay two orders of
// magnitude below this bound.
inline constexpr double kFp32Tolerance = 1e-5;

namespace ref {

// Optional bias: an empty Vec means none.
Vec linear_forward(std::int64_t tokens, std::int64_t in, std::int64_t out, const Vec& x, const Vec& w, const Vec& b);
struct LinearGrads {
  Vec dx, dw, db;
};
LinearGrads linear_backward(std::int64_t tokens, std::int64_t in, std::int64_t out, const Vec& dy, const Vec& x,
                            const Vec& w);

Vec embedding_forward(std::int64_t tokens, std::int64_t hidden, const IVec& ids, const Vec& table, VocabShard shard);
Vec embedding_backward(std::int64_t tokens, std::int64_t hidden, const IVec& ids, const Vec& dout, VocabShard shard);
Vec position_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const Vec& x, const Vec& pos);
Vec position_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const Vec& dx);

// x [batch * seq, n_heads * d] contiguous; angles in float64 from theta.
Vec rope_forward(std::int64_t batch, std::int64_t seq, std::int64_t n_heads, std::int64_t d, double theta,
                 const Vec& x);
Vec rope_backward(std::int64_t batch, std::int64_t seq, std::int64_t n_heads, std::int64_t d, double theta,
                  const Vec& dy);

struct NormGrads {
  Vec dx, dgamma, dbeta;
};
// beta empty: no bias.
Vec layernorm_forward(std::int64_t rows, std::int64_t h, const Vec& x, const Vec& gamma, const Vec& beta, double eps);
NormGrads layernorm_backward(std::int64_t rows, std::int64_t h, const Vec& x, const Vec& gamma, double eps,
                             const Vec& dy);
Vec rmsnorm_forward(std::int64_t rows, std::int64_t h, const Vec& x, const Vec& gamma, double eps);
// The statistics forward saves: mean (LayerNorm) and rstd per row.
Vec row_means(std::int64_t rows, std::int64_t h, const Vec& x);
Vec layernorm_rstd(std::int64_t rows, std::int64_t h, const Vec& x, double eps);
Vec rmsnorm_rstd(std::int64_t rows, std::int64_t h, const Vec& x, double eps);
NormGrads rmsnorm_backward(std::int64_t rows, std::int64_t h, const Vec& x, const Vec& gamma, double eps,
                           const Vec& dy);

struct AttentionDims {
  std::int64_t batch, seq, heads, kv_heads, d;
};
struct AttentionDropoutRef {
  double p = 0;
  DropoutKey key;
  std::int64_t sample_begin = 0, head_begin = 0, total_heads = 0;
};
// q [tokens, heads * d], k, v [tokens, kv_heads * d], o [tokens, heads * d], all contiguous. drop may be nullptr.
Vec attention_forward(const AttentionDims& a, const Vec& q, const Vec& k, const Vec& v,
                      const AttentionDropoutRef* drop);
// lse [batch, heads, seq]: log sum_j exp(S_ij) over the causal row.
Vec attention_lse(const AttentionDims& a, const Vec& q, const Vec& k);
struct AttentionGrads {
  Vec dq, dk, dv;
};
// Textbook softmax backward (dS = P o (dP - rowsum(P o dP))), not FlashAttention's D = dO . O form.
AttentionGrads attention_backward(const AttentionDims& a, const Vec& q, const Vec& k, const Vec& v, const Vec& dout,
                                  const AttentionDropoutRef* drop);

Vec gelu_forward(const Vec& x);
Vec gelu_backward(const Vec& x, const Vec& dy);
Vec swiglu_forward(std::int64_t tokens, std::int64_t ffn, const Vec& gate_up);
Vec swiglu_backward(std::int64_t tokens, std::int64_t ffn, const Vec& gate_up, const Vec& dy);

// out = residual + dropout(x); residual empty: none. Masks from dropout_uniform().
Vec dropout_add_forward(const HiddenLayout& l, const Vec& x, const Vec& residual, double p, const DropoutKey& key);
Vec dropout_add_backward(const HiddenLayout& l, const Vec& dout, double p, const DropoutKey& key);

// Full-vocabulary cross entropy: logits [tokens, vocab]. Returns per-token losses.
Vec cross_entropy_forward(std::int64_t tokens, std::int64_t vocab, const Vec& logits, const IVec& targets);
Vec cross_entropy_backward(std::int64_t tokens, std::int64_t vocab, const Vec& logits, const IVec& targets,
                           const Vec& dloss);

struct AdamWState {
  Vec param, m, v;
};
void adamw_step(AdamWState& s, const Vec& grad, double lr, double beta1, double beta2, double eps, double wd,
                bool decay, std::int64_t step, double grad_scale);

}  // namespace ref

// Central finite differences of L(inputs) = sum_i f(inputs)_i * weights_i with respect to every element of
// inputs[which], in float64 (step h).
Vec numeric_gradient(const std::function<Vec(const std::vector<Vec>&)>& f, std::vector<Vec> inputs, std::size_t which,
                     const Vec& weights, double h = 1e-6);

// ||a - b|| / ||b|| in float64.
double rel_error(const Vec& a, const Vec& b);

// Sets the kernels' thread count for its lifetime (cpu::set_kernel_threads), then puts the old one back.
class KernelThreads {
 public:
  explicit KernelThreads(int n) : saved_(cpu::kernel_threads()) { cpu::set_kernel_threads(n); }
  ~KernelThreads() { cpu::set_kernel_threads(saved_); }
  KernelThreads(const KernelThreads&) = delete;
  KernelThreads& operator=(const KernelThreads&) = delete;

 private:
  int saved_;
};

}  // namespace dtrain::kernels::testing
