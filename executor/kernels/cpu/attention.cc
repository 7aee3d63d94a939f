#include "dtrain/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/dropout_mask.h"
#include "cpu/parallel.h"
#include "cpu/small_gemm.h"
#include "cpu/vec.h"
#include "dtrain/common/error.h"

namespace dtrain::kernels::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// dst[c * ld + j] = src[j * stride + c] for j in [0, rows), c in [0, d): a head's keys (or values) transposed so that
// the score product reads them row-major. Blocks of 16 rows, so every store writes 16 consecutive floats; ld is
// padded by padded_ld() so that consecutive columns do not fall into the same cache sets.
DTRAIN_KERNEL_CLONES void pack_transposed(std::int64_t rows, std::int64_t d, const float* src, std::int64_t stride,
                                          float* dst, std::int64_t ld) {
  constexpr std::int64_t kBlock = 16;
  std::int64_t j0 = 0;
  for (; j0 + kBlock <= rows; j0 += kBlock) {
    for (std::int64_t c = 0; c < d; ++c) {
      for (std::int64_t j = 0; j < kBlock; ++j) dst[c * ld + j0 + j] = src[(j0 + j) * stride + c];
    }
  }
  for (std::int64_t c = 0; c < d; ++c) {
    for (std::int64_t j = j0; j < rows; ++j) dst[c * ld + j] = src[j * stride + c];
  }
}

// dst[j * d + c] = src[j * stride + c]: one head's rows made contiguous.
void gather_rows(std::int64_t rows, std::int64_t d, const float* src, std::int64_t stride, float* dst) {
  for (std::int64_t j = 0; j < rows; ++j) std::copy(src + j * stride, src + j * stride + d, dst + j * d);
}

// dst[j * stride + c] = src[j * d + c].
void scatter_rows(std::int64_t rows, std::int64_t d, const float* src, float* dst, std::int64_t stride) {
  for (std::int64_t j = 0; j < rows; ++j) std::copy(src + j * d, src + (j + 1) * d, dst + j * stride);
}

// Leading dimension of a transposed [d, seq] buffer: seq rounded up to 64 floats, plus 16. It is then 16 mod 64, never
// a power of two: with a power-of-two row pitch the rows of a column would fall onto the same cache sets.
std::int64_t padded_ld(std::int64_t seq) { return (seq + 63) / 64 * 64 + 16; }

// Keys of row i0 + r that are visible in the chunk starting at j0 (causal): min(nk, i - j0 + 1), possibly <= 0.
inline std::int64_t visible_keys(std::int64_t i, std::int64_t j0, std::int64_t nk) { return std::min(nk, i - j0 + 1); }

// Online-softmax update of one tile (FlashAttention Algorithm 1, lines 9-12). On entry s holds the scaled scores;
// on exit the probabilities relative to the new running max (0 where masked), dropout applied when scales != nullptr.
// m, l: running max and sum per row; acc: the unnormalised output rows, rescaled here by exp(m_old - m_new).
DTRAIN_KERNEL_CLONES void softmax_tile_forward(std::int64_t rows, std::int64_t nk, std::int64_t i0, std::int64_t j0,
                                               float* s, std::int64_t lds, float* m, float* l, float* acc,
                                               std::int64_t d, const float* scales, std::int64_t ld_scales) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * lds;
    const std::int64_t valid = visible_keys(i0 + r, j0, nk);
    if (valid <= 0) {
      std::fill(sr, sr + nk, 0.0f);
      continue;
    }
    const float m_new = std::max(m[r], vec::max(sr, valid));
    const float corr = vec::exp_nonpos(m[r] - m_new);
    float sum_acc[vec::kLanes] = {};
    std::int64_t j = 0;
    for (; j + vec::kLanes <= valid; j += vec::kLanes) {
      for (int k = 0; k < vec::kLanes; ++k) {
        const float p = vec::exp_nonpos(sr[j + k] - m_new);
        sr[j + k] = p;
        sum_acc[k] += p;
      }
    }
    for (int k = 0; j + k < valid; ++k) {
      const float p = vec::exp_nonpos(sr[j + k] - m_new);
      sr[j + k] = p;
      sum_acc[k] += p;
    }
    std::fill(sr + valid, sr + nk, 0.0f);
    l[r] = l[r] * corr + vec::combine(sum_acc);
    m[r] = m_new;
    float* ar = acc + r * d;
    for (std::int64_t c = 0; c < d; ++c) ar[c] *= corr;
    if (scales != nullptr) {
      const float* z = scales + r * ld_scales;
      for (std::int64_t jj = 0; jj < valid; ++jj) sr[jj] *= z[jj];
    }
  }
}

// Backward tile: s holds scaled scores on entry. Writes p = exp(s - lse) (masked to 0) into s; when scales is given
// also pd = p * scales. dp holds dO V^T on entry and dS = p * (dp * scales - D) on exit.
DTRAIN_KERNEL_CLONES void softmax_tile_backward(std::int64_t rows, std::int64_t nk, std::int64_t i0, std::int64_t j0,
                                                float* s, float* dp, float* pd, std::int64_t ld, const float* lse,
                                                const float* delta, const float* scales) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    float* dpr = dp + r * ld;
    const std::int64_t valid = std::max<std::int64_t>(0, visible_keys(i0 + r, j0, nk));
    const float lr = lse[r];
    const float dr = delta[r];
    if (scales != nullptr) {
      const float* z = scales + r * ld;
      float* pdr = pd + r * ld;
      for (std::int64_t j = 0; j < valid; ++j) {
        const float p = vec::exp_nonpos(sr[j] - lr);
        sr[j] = p;
        pdr[j] = p * z[j];
        dpr[j] = p * (dpr[j] * z[j] - dr);
      }
      std::fill(pdr + valid, pdr + nk, 0.0f);
    } else {
      for (std::int64_t j = 0; j < valid; ++j) {
        const float p = vec::exp_nonpos(sr[j] - lr);
        sr[j] = p;
        dpr[j] = p * (dpr[j] - dr);
      }
    }
    std::fill(sr + valid, sr + nk, 0.0f);
    std::fill(dpr + valid, dpr + nk, 0.0f);
  }
}

// o = acc / l, lse = m + log(l) for the rows of one query block.
DTRAIN_KERNEL_CLONES void finish_rows(std::int64_t rows, std::int64_t d, const float* acc, const float* m,
                                      const float* l, float* o, std::int64_t o_stride, float* lse) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / l[r];
    for (std::int64_t c = 0; c < d; ++c) o[r * o_stride + c] = acc[r * d + c] * inv;
    lse[r] = m[r] + std::log(l[r]);
  }
}

// D[r] = dO[r] . O[r] for the rows of one query block.
DTRAIN_KERNEL_CLONES void row_dots(std::int64_t rows, std::int64_t d, const float* dout, std::int64_t dout_stride,
                                   const float* o, std::int64_t o_stride, float* delta) {
  for (std::int64_t r = 0; r < rows; ++r) delta[r] = vec::dot(dout + r * dout_stride, o + r * o_stride, d);
}

// Scratch memory of the calling thread, reused across calls (it only grows): allocating a few hundred kilobytes per
// (sequence, head) item costs page faults comparable to the arithmetic. Carves consecutive buffers out of one block.
class Scratch {
 public:
  explicit Scratch(std::size_t floats) {
    thread_local std::vector<float> block;
    if (block.size() < floats) block.resize(floats);
    next_ = block.data();
  }
  float* take(std::size_t floats) {
    float* p = next_;
    next_ += (floats + 15) / 16 * 16;  // keep every buffer 64-byte aligned relative to the block
    return p;
  }

 private:
  float* next_ = nullptr;
};

// Floats Scratch::take hands out for these sizes (rounded as take() rounds).
std::size_t scratch_size(std::initializer_list<std::size_t> sizes) {
  std::size_t total = 0;
  for (std::size_t n : sizes) total += (n + 15) / 16 * 16;
  return total;
}

struct Geometry {
  const AttentionShape& s;
  std::int64_t group;     // query heads per kv head
  std::int64_t o_stride;  // n_heads * head_dim
  float scale;
};

// Dropout scales of a tile: rows [i0, i0 + rows) of head h, keys [j0, j0 + nk) of sequence b.
void tile_dropout_scales(const Geometry& g, const AttentionDropout& drop, std::int64_t b, std::int64_t h,
                         std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t nk, float* z,
                         std::int64_t ldz) {
  const std::int64_t seq = g.s.seq;
  const std::int64_t head = (drop.sample_begin + b) * drop.total_heads + drop.head_begin + h;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint64_t first = static_cast<std::uint64_t>((head * seq + i0 + r) * seq + j0);
    dropout_scales(drop.key, first, nk, drop.p, z + r * ldz);
  }
}

// Each item works on dense copies of its operands (queries, keys, values of one sequence and kv head): the fused QKV
// rows are thousands of floats apart, and the tile products run about twice as fast on contiguous panels.
void forward_item(const Geometry& g, std::int64_t b, std::int64_t kvh, const float* q, const float* k, const float* v,
                  float* o, float* lse, const AttentionDropout* drop) {
  const AttentionShape& s = g.s;
  const std::int64_t d = s.head_dim;
  const std::int64_t seq = s.seq, nq = s.query_rows(), q0 = s.q_offset;
  const std::int64_t ldt = padded_ld(seq);
  const auto transposed = static_cast<std::size_t>(d * ldt);
  const auto panel = static_cast<std::size_t>(seq * d);
  const auto q_panel = static_cast<std::size_t>(nq * d);
  const auto tile_size = static_cast<std::size_t>(kQueryBlock * kKeyChunk);
  const auto acc_size = static_cast<std::size_t>(kQueryBlock * d);
  Scratch scratch(scratch_size({transposed, panel, q_panel, tile_size, tile_size, acc_size}));
  float* kt = scratch.take(transposed);  // K^T of this (sequence, kv head): [d, seq]
  float* vc = scratch.take(panel);       // V: [seq, d]
  float* qc = scratch.take(q_panel);     // Q of one head: [nq, d]
  float* tile = scratch.take(tile_size);
  float* scales = drop != nullptr ? scratch.take(tile_size) : nullptr;
  float* acc = scratch.take(acc_size);
  float m[kQueryBlock];
  float l[kQueryBlock];
  pack_transposed(seq, d, k + b * seq * s.kv_stride + kvh * d, s.kv_stride, kt, ldt);
  gather_rows(seq, d, v + b * seq * s.kv_stride + kvh * d, s.kv_stride, vc);
  for (std::int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    gather_rows(nq, d, q + b * nq * s.q_stride + h * d, s.q_stride, qc);
    float* ob = o + b * nq * g.o_stride + h * d;
    float* lse_bh = lse + (b * s.n_heads + h) * nq;
    for (std::int64_t i0 = 0; i0 < nq; i0 += kQueryBlock) {
      const std::int64_t rows = std::min(kQueryBlock, nq - i0);
      const std::int64_t i1 = std::min(seq, q0 + i0 + rows);  // keys visible to the block: [0, i1)
      std::fill(m, m + rows, kNegInf);
      std::fill(l, l + rows, 0.0f);
      std::fill(acc, acc + rows * d, 0.0f);
      for (std::int64_t j0 = 0; j0 < i1; j0 += kKeyChunk) {
        const std::int64_t nk = std::min(kKeyChunk, i1 - j0);
        small_gemm(rows, nk, d, g.scale, qc + i0 * d, d, 1, kt + j0, ldt, false, tile, kKeyChunk);
        if (drop != nullptr) tile_dropout_scales(g, *drop, b, h, i0, rows, j0, nk, scales, kKeyChunk);
        softmax_tile_forward(rows, nk, q0 + i0, j0, tile, kKeyChunk, m, l, acc, d, scales, kKeyChunk);
        small_gemm(rows, d, nk, 1.0f, tile, kKeyChunk, 1, vc + j0 * d, d, true, acc, d);
      }
      finish_rows(rows, d, acc, m, l, ob + i0 * g.o_stride, g.o_stride, lse_bh + i0);
    }
  }
}

void backward_item(const Geometry& g, std::int64_t b, std::int64_t kvh, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                   const AttentionDropout* drop) {
  const AttentionShape& s = g.s;
  const std::int64_t d = s.head_dim;
  const std::int64_t seq = s.seq, nq = s.query_rows(), q0 = s.q_offset;
  const std::int64_t ldt = padded_ld(seq);
  const auto transposed = static_cast<std::size_t>(d * ldt);
  const auto panel = static_cast<std::size_t>(seq * d);
  const auto q_panel = static_cast<std::size_t>(nq * d);
  const auto tile_size = static_cast<std::size_t>(kQueryBlock * kKeyChunk);
  Scratch scratch(scratch_size({transposed, transposed, panel, q_panel, q_panel, q_panel, panel, panel, tile_size,
                                tile_size, tile_size, tile_size}));
  float* kt = scratch.take(transposed);  // K^T, V^T: [d, seq]
  float* vt = scratch.take(transposed);
  float* kc = scratch.take(panel);  // K: [seq, d]; Q, dO: [nq, d]
  float* qc = scratch.take(q_panel);
  float* doc = scratch.take(q_panel);
  float* dqc = scratch.take(q_panel);  // gradients: dQ [nq, d], dK and dV [seq, d]
  float* dkc = scratch.take(panel);
  float* dvc = scratch.take(panel);
  float* p_tile = scratch.take(tile_size);
  float* dp_tile = scratch.take(tile_size);
  float* pd_tile = drop != nullptr ? scratch.take(tile_size) : nullptr;
  float* scales = drop != nullptr ? scratch.take(tile_size) : nullptr;
  float delta[kQueryBlock];
  const float* kb = k + b * seq * s.kv_stride + kvh * d;
  const float* vb = v + b * seq * s.kv_stride + kvh * d;
  pack_transposed(seq, d, kb, s.kv_stride, kt, ldt);
  pack_transposed(seq, d, vb, s.kv_stride, vt, ldt);
  gather_rows(seq, d, kb, s.kv_stride, kc);
  std::fill(dkc, dkc + panel, 0.0f);
  std::fill(dvc, dvc + panel, 0.0f);
  for (std::int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    gather_rows(nq, d, q + b * nq * s.q_stride + h * d, s.q_stride, qc);
    gather_rows(nq, d, dout + b * nq * g.o_stride + h * d, g.o_stride, doc);
    const float* ob = o + b * nq * g.o_stride + h * d;
    const float* lse_bh = lse + (b * s.n_heads + h) * nq;
    std::fill(dqc, dqc + q_panel, 0.0f);
    for (std::int64_t i0 = 0; i0 < nq; i0 += kQueryBlock) {
      const std::int64_t rows = std::min(kQueryBlock, nq - i0);
      const std::int64_t i1 = std::min(seq, q0 + i0 + rows);  // keys visible to the block: [0, i1)
      row_dots(rows, d, doc + i0 * d, d, ob + i0 * g.o_stride, g.o_stride, delta);
      for (std::int64_t j0 = 0; j0 < i1; j0 += kKeyChunk) {
        const std::int64_t nk = std::min(kKeyChunk, i1 - j0);
        small_gemm(rows, nk, d, g.scale, qc + i0 * d, d, 1, kt + j0, ldt, false, p_tile, kKeyChunk);
        small_gemm(rows, nk, d, 1.0f, doc + i0 * d, d, 1, vt + j0, ldt, false, dp_tile, kKeyChunk);
        if (drop != nullptr) tile_dropout_scales(g, *drop, b, h, i0, rows, j0, nk, scales, kKeyChunk);
        softmax_tile_backward(rows, nk, q0 + i0, j0, p_tile, dp_tile, pd_tile, kKeyChunk, lse_bh + i0, delta, scales);
        const float* p_used = drop != nullptr ? pd_tile : p_tile;
        // dV[j0:j0+nk] += P^T dO: A = P^T, i.e. element (j, r) at p[r * ld + j].
        small_gemm(nk, d, rows, 1.0f, p_used, 1, kKeyChunk, doc + i0 * d, d, true, dvc + j0 * d, d);
        // dQ[i0:i1] += scale dS K[j0:j0+nk]
        small_gemm(rows, d, nk, g.scale, dp_tile, kKeyChunk, 1, kc + j0 * d, d, true, dqc + i0 * d, d);
        // dK[j0:j0+nk] += scale dS^T Q[i0:i1]
        small_gemm(nk, d, rows, g.scale, dp_tile, 1, kKeyChunk, qc + i0 * d, d, true, dkc + j0 * d, d);
      }
    }
    scatter_rows(nq, d, dqc, dq + b * nq * s.q_stride + h * d, s.q_stride);
  }
  scatter_rows(seq, d, dkc, dk + b * seq * s.kv_stride + kvh * d, s.kv_stride);
  scatter_rows(seq, d, dvc, dv + b * seq * s.kv_stride + kvh * d, s.kv_stride);
}

Geometry check_shape(const AttentionShape& s) {
  DTRAIN_CHECK(s.batch >= 0 && s.seq >= 0 && s.head_dim > 0, "attention: negative or empty dimensions");
  DTRAIN_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0, "attention: n_kv_heads must divide n_heads");
  DTRAIN_CHECK(s.q_stride >= s.n_heads * s.head_dim, "attention: q_stride smaller than the query heads");
  DTRAIN_CHECK(s.kv_stride >= s.n_kv_heads * s.head_dim, "attention: kv_stride smaller than the kv heads");
  DTRAIN_CHECK(s.q_rows >= 0 && s.q_offset >= 0, "attention: negative query rows or offset");
  return Geometry{s, s.n_heads / s.n_kv_heads, s.n_heads * s.head_dim,
                  static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)))};
}

const AttentionDropout* active_dropout(const AttentionDropout* drop, const AttentionShape& s) {
  if (drop == nullptr || drop->p == 0.0f) return nullptr;
  DTRAIN_CHECK(s.q_rows == 0 && s.q_offset == 0, "attention dropout needs whole sequences of queries");
  DTRAIN_CHECK(drop->p > 0.0f && drop->p < 1.0f, "attention dropout probability must be in [0, 1)");
  check_dropout_key(drop->key);
  return drop;
}

}  // namespace

void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v, float* o,
                       float* lse, const AttentionDropout* dropout) {
  const Geometry g = check_shape(shape);
  const AttentionDropout* drop = active_dropout(dropout, shape);
  parallel_ranges(shape.batch * shape.n_kv_heads, g.group * shape.seq * shape.seq * shape.head_dim,
                  [&](std::int64_t begin, std::int64_t end) {
                    for (std::int64_t item = begin; item < end; ++item) {
                      forward_item(g, item / shape.n_kv_heads, item % shape.n_kv_heads, q, k, v, o, lse, drop);
                    }
                  });
}

void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        const AttentionDropout* dropout) {
  const Geometry g = check_shape(shape);
  const AttentionDropout* drop = active_dropout(dropout, shape);
  parallel_ranges(shape.batch * shape.n_kv_heads, g.group * shape.seq * shape.seq * shape.head_dim,
                  [&](std::int64_t begin, std::int64_t end) {
                    for (std::int64_t item = begin; item < end; ++item) {
                      backward_item(g, item / shape.n_kv_heads, item % shape.n_kv_heads, q, k, v, o, lse, dout, dq, dk,
                                    dv, drop);
                    }
                  });
}

}  // namespace dtrain::kernels::cpu
