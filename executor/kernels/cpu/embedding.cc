#include "dtrain/kernels/embedding.h"

#include <algorithm>

#include "cpu/parallel.h"
#include "cpu/vec.h"

namespace dtrain::kernels::cpu {

namespace {

DTRAIN_KERNEL_CLONES void lookup_rows(std::int64_t begin, std::int64_t end, std::int64_t hidden,
                                      const std::int32_t* ids, const float* table, VocabShard shard, float* out) {
  for (std::int64_t t = begin; t < end; ++t) {
    float* row = out + t * hidden;
    if (shard.contains(ids[t])) {
      const float* src = table + (ids[t] - shard.begin) * hidden;
      std::copy(src, src + hidden, row);
    } else {
      std::fill(row, row + hidden, 0.0f);
    }
  }
}

DTRAIN_KERNEL_CLONES void add_positions(std::int64_t row_begin, std::int64_t row_end, std::int64_t seq,
                                        std::int64_t hidden, const float* pos, float* x) {
  for (std::int64_t r = row_begin; r < row_end; ++r) {
    float* row = x + r * hidden;
    const float* p = pos + (r % seq) * hidden;
    for (std::int64_t j = 0; j < hidden; ++j) row[j] += p[j];
  }
}

DTRAIN_KERNEL_CLONES void position_grad_rows(std::int64_t s_begin, std::int64_t s_end, std::int64_t batch,
                                             std::int64_t seq, std::int64_t hidden, const float* dx, float* dpos) {
  for (std::int64_t s = s_begin; s < s_end; ++s) {
    float* out = dpos + s * hidden;
    for (std::int64_t b = 0; b < batch; ++b) {
      const float* g = dx + (b * seq + s) * hidden;
      for (std::int64_t j = 0; j < hidden; ++j) out[j] += g[j];
    }
  }
}

// dtable[ids[t]] += dout[t] for the hidden columns [c_begin, c_end): threads split the columns, every column sees
// the tokens in order.
DTRAIN_KERNEL_CLONES void scatter_columns(std::int64_t c_begin, std::int64_t c_end, std::int64_t tokens,
                                          std::int64_t hidden, const std::int32_t* ids, const float* dout,
                                          VocabShard shard, float* dtable) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (!shard.contains(ids[t])) continue;
    float* dst = dtable + (ids[t] - shard.begin) * hidden;
    const float* g = dout + t * hidden;
    for (std::int64_t j = c_begin; j < c_end; ++j) dst[j] += g[j];
  }
}

}  // namespace

void embedding_forward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const float* table,
                       VocabShard shard, float* out) {
  parallel_ranges(tokens, hidden,
                  [&](std::int64_t b, std::int64_t e) { lookup_rows(b, e, hidden, ids, table, shard, out); });
}

void embedding_backward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const float* dout,
                        VocabShard shard, float* dtable) {
  parallel_ranges(hidden, tokens, [&](std::int64_t b, std::int64_t e) {
    scatter_columns(b, e, tokens, hidden, ids, dout, shard, dtable);
  });
}

void position_embedding_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const float* pos, float* x) {
  parallel_ranges(batch * seq, hidden,
                  [&](std::int64_t b, std::int64_t e) { add_positions(b, e, seq, hidden, pos, x); });
}

void position_embedding_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const float* dx,
                                 float* dpos) {
  parallel_ranges(seq, batch * hidden,
                  [&](std::int64_t b, std::int64_t e) { position_grad_rows(b, e, batch, seq, hidden, dx, dpos); });
}

}  // namespace dtrain::kernels::cpu
