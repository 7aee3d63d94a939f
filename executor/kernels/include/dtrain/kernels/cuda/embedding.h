// Token embedding (vocab-parallel) and learned positions on the GPU: dtrain/kernels/embedding.h's formulas and
// layouts. ids int32 (device); table and position table bf16 (copies of the fp32 master weights); out / x bf16;
// dtable and dpos fp32, accumulated (+=).
//
// embedding_backward is deterministic and adds each table row's gradients in token order, exactly as the CPU backend
// does (the same fp32 additions in the same order, so the same bits from the same dout): the first occurrence of each
// id in the batch "owns" its row (found with an integer atomicMin, whose result does not depend on the order), and one
// block per owner scans the later tokens for the same id and adds their rows in order. No float atomics. The scan
// reads all ids once per owner block, O(tokens * distinct ids) cheap integer compares; scratch: one int per row of the
// shard, from the pool.
#pragma once

#include <cstdint>

#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/embedding.h"

namespace dtrain::kernels::cuda {

// out[t, :] = table[ids[t] - begin, :] when ids[t] is in the shard, else 0.
void embedding_forward(Context& ctx, std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids,
                       const bf16* table, VocabShard shard, bf16* out);

// dtable[ids[t] - begin, :] += dout[t, :] for every token in the shard, in token order.
void embedding_backward(Context& ctx, std::int64_t tokens, std::int64_t hidden, const std::int32_t* ids,
                        const bf16* dout, VocabShard shard, float* dtable);

// x[b, s, :] += pos[s, :] in place.
void position_embedding_forward(Context& ctx, std::int64_t batch, std::int64_t seq, std::int64_t hidden,
                                const bf16* pos, bf16* x);

// dpos[s, :] += sum_b dx[b, s, :] (b in order).
void position_embedding_backward(Context& ctx, std::int64_t batch, std::int64_t seq, std::int64_t hidden,
                                 const bf16* dx, float* dpos);

}  // namespace dtrain::kernels::cuda
