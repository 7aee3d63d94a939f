// Token embedding (vocab-parallel) and learned position embedding.
//
// Vocab-parallel split (Megatron's VocabParallelEmbedding): the table's rows [begin, end) of the full vocabulary
// live on this rank. A token outside the shard contributes a zero row, so the sum over the tensor-parallel group
// (the caller's all-reduce) is the full lookup. With tp = 1 the shard is [0, vocab).
//
// Layouts (row-major, contiguous): ids [tokens] (int32, token t = b * seq + s); table [end - begin, hidden];
// out [tokens, hidden]; position table [seq, hidden].
// Activation gradients are overwritten, parameter gradients accumulated (+=), as everywhere in dtrain::kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace dtrain::kernels {

// Rows [begin, end) of the full (padded) vocabulary held by this rank. The vocabulary is padded for tensor
// parallelism as Megatron pads it (dtrain/model/layout_fit.h): ids at or above real_end are padding rows, which no
// token names and whose logits take no probability (the cross entropy skips them and gives them a zero gradient).
struct VocabShard {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t real_end = std::numeric_limits<std::int64_t>::max();  // the real vocabulary's size
  std::int64_t size() const { return end - begin; }
  // Columns [0, real_size()) of this shard are real vocabulary entries, the rest padding (possibly all of it).
  std::int64_t real_size() const { return std::clamp<std::int64_t>(real_end - begin, 0, size()); }
  bool contains(std::int64_t id) const { return id >= begin && id < end; }
};

namespace cpu {

// out[t, :] = table[ids[t] - begin, :] when ids[t] is in the shard, else 0.
void embedding_forward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const float* table,
                       VocabShard shard, float* out);

// dtable[ids[t] - begin, :] += dout[t, :] for every token in the shard, tokens in order (a token repeated in the
// batch adds its gradients in token order, so the result is repeatable).
void embedding_backward(std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids, const float* dout,
                        VocabShard shard, float* dtable);

// Learned positions, added in place: x[b, s, :] += pos[s, :] for a batch of `batch` sequences of `seq` tokens.
// With sequence parallelism pass the table rows of this rank's sequence slice (pos + seq_begin * hidden).
void position_embedding_forward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const float* pos, float* x);

// dpos[s, :] += sum_b dx[b, s, :] (b in order).
void position_embedding_backward(std::int64_t batch, std::int64_t seq, std::int64_t hidden, const float* dx,
                                 float* dpos);

}  // namespace cpu
}  // namespace dtrain::kernels
