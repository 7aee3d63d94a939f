// Context parallelism in the interpreter (interpreter.h): each sequence is cut into 2 * cp chunks and this rank holds
// chunks cp_rank and 2 * cp - 1 - cp_rank (Megatron's load-balanced causal order), as T = micro_batch x seq_len / cp
// rows: per sequence its first chunk's rows, then its second's. Every op but the attention works on those rows as
// they are (positions from for_each_sequence_piece); the attention gathers the whole sequences' keys and values over
// the cp ranks (ALLGATHER what=kv), runs this rank's queries of each chunk against the keys up to the chunk's end,
// and in the backward sums the keys' and values' gradients back to their chunks' ranks (REDUCESCATTER what=kv_grad).
#include <fmt/format.h>

#include "dtrain/kernels/attention.h"
#include "interpreter.h"

namespace dtrain::exec::detail {

namespace k = dtrain::kernels;
using ir::Instr;

template <typename A>
std::vector<std::int32_t> Interpreter<A>::local_tokens(const std::vector<std::int32_t>& all) const {
  if (prog.cp == 1) return all;
  std::vector<std::int32_t> out(static_cast<std::size_t>(T));
  for_each_sequence_piece(0, T, [&](std::int64_t sample, std::int64_t pos, std::int64_t len, std::int64_t row) {
    const auto from = all.begin() + sample * m.seq_len + pos;
    std::copy(from, from + len, out.begin() + row);
  });
  return out;
}

template <typename A>
void Interpreter<A>::rope(bool backward, Tensor& qkv_rows) {
  A* qkv = qkv_rows.data();
  // The query heads, then the key heads (the value heads are not rotated), of the rows of one run of positions.
  auto rotate = [&](std::int64_t batch, std::int64_t seq, std::int64_t pos, A* rows) {
    const float* cos = rope_cos.data() + pos * d / 2;
    const float* sin = rope_sin.data() + pos * d / 2;
    for (auto [heads, col] : {std::pair{Hl, std::int64_t{0}}, std::pair{KVl, Hl * d}}) {
      const k::RopeShape shape{batch, seq, heads, d, qkv_cols};
      if (backward)
        kern.rope_backward(shape, cos, sin, rows + col);
      else
        kern.rope_forward(shape, cos, sin, rows + col);
    }
  };
  if (prog.cp == 1) {
    rotate(prog.micro_batch, m.seq_len, 0, qkv);
    return;
  }
  for_each_sequence_piece(0, T, [&](std::int64_t, std::int64_t pos, std::int64_t len, std::int64_t row) {
    rotate(1, len, pos, qkv + row * qkv_cols);
  });
}

namespace {
// The keys' and values' columns of a fused QKV row: the last 2 * kv_heads * head_dim of (heads + 2 kv_heads) heads.
struct KvColumns {
  std::int64_t first, width;
};
}  // namespace

template <typename A>
void Interpreter<A>::copy_kv_columns(Tensor& qkv, Tensor& packed, bool to_packed) {
  const KvColumns kv{Hl * d, 2 * KVl * d};
  const auto bytes = static_cast<std::size_t>(kv.width) * sizeof(A);
  for (std::int64_t r = 0; r < T; ++r) {
    A* row = qkv.data() + r * qkv_cols + kv.first;
    A* out = packed.data() + r * kv.width;
    if (to_packed)
      be.copy(out, row, bytes);
    else
      be.copy(row, out, bytes);
  }
}

template <typename A>
void Interpreter<A>::reorder_kv_chunks(Tensor& by_rank, Tensor& by_position, bool to_positions) {
  // Rank r's rows of the gathered tensor are its two chunks of every sequence of the micro-batch, in its row order.
  const std::int64_t c = cp_chunk_tokens(), width = 2 * KVl * d;
  const auto bytes = static_cast<std::size_t>(c * width) * sizeof(A);
  for (std::int64_t rank = 0; rank < prog.cp; ++rank) {
    for (std::int64_t b = 0; b < prog.micro_batch; ++b) {
      for (std::int64_t piece = 0; piece < 2; ++piece) {
        A* gathered = by_rank.data() + (rank * T + (b * 2 + piece) * c) * width;
        A* placed = by_position.data() + (b * m.seq_len + cp_chunk_of(rank, piece) * c) * width;
        if (to_positions)
          be.copy(placed, gathered, bytes);
        else
          be.copy(gathered, placed, bytes);
      }
    }
  }
}

template <typename A>
void Interpreter<A>::kv_gather(const Instr& in, ChunkState<A>& st, Tensor& cur, Tensor& rcur) {
  LayerState<A>& ls = layer_state(st, in.layer);
  const std::int64_t width = 2 * KVl * d;
  check_count(in, static_cast<std::int64_t>(prog.micro_batch) * m.seq_len * width);
  // The forward's (or a full recomputation's) QKV is the tensor flowing through the body; a backward gathers again
  // from the QKV the forward kept.
  Tensor& qkv = in.pass == ir::Pass::kForward ? cur : in.pass == ir::Pass::kRecompute ? rcur : ls.qkv;
  Tensor mine(be, static_cast<std::size_t>(T * width), kUninitialized);
  copy_kv_columns(qkv, mine, true);
  Tensor all(be, static_cast<std::size_t>(prog.cp * T * width), kUninitialized);
  communicate(*comms.cp, [&] { comms.cp->all_gather(mine.data(), all.data(), mine.size(), kAct); });
  sized(ls.kv, all.size(), kUninitialized);
  reorder_kv_chunks(all, ls.kv, true);
}

template <typename A>
void Interpreter<A>::kv_grad_scatter(const Instr& in, ChunkState<A>& st, Tensor& cur) {
  LayerState<A>& ls = layer_state(st, in.layer);
  check_count(in, static_cast<std::int64_t>(ls.dkv.size()));
  // Every rank's chunks' gradients, in the order the reduce-scatter hands them out (rank by rank).
  Tensor by_rank(be, ls.dkv.size(), kUninitialized);
  reorder_kv_chunks(by_rank, ls.dkv, false);
  ls.dkv.clear();
  Tensor mine(be, static_cast<std::size_t>(T * 2 * KVl * d), kUninitialized);
  communicate(*comms.cp,
              [&] { comms.cp->reduce_scatter(by_rank.data(), mine.data(), mine.size(), kAct, comm::ReduceOp::kSum); });
  copy_kv_columns(cur, mine, false);
}

namespace {
// The attention of one chunk's queries (rows `rows` of this rank, positions chunk * c ..) against the keys of its
// sequence up to the chunk's end.
k::AttentionShape chunk_shape(std::int64_t chunk, std::int64_t c, std::int64_t heads, std::int64_t kv_heads,
                              std::int64_t d, std::int64_t q_stride, std::int64_t kv_stride) {
  k::AttentionShape s{1, (chunk + 1) * c, heads, kv_heads, d, q_stride, kv_stride};
  s.q_rows = c;
  s.q_offset = chunk * c;
  return s;
}
}  // namespace

template <typename A>
void Interpreter<A>::cp_attention_forward(LayerState<A>& ls) {
  const std::int64_t c = cp_chunk_tokens(), width = 2 * KVl * d;
  for (std::int64_t b = 0; b < prog.micro_batch; ++b) {
    for (std::int64_t piece = 0; piece < 2; ++piece) {
      const std::int64_t rows = (b * 2 + piece) * c;
      const A* keys = ls.kv.data() + b * m.seq_len * width;
      kern.attention_forward(chunk_shape(cp_chunk(piece), c, Hl, KVl, d, qkv_cols, width),
                             ls.qkv.data() + rows * qkv_cols, keys, keys + KVl * d, ls.o.data() + rows * Hl * d,
                             ls.lse.data() + rows * Hl, nullptr);
    }
  }
}

template <typename A>
void Interpreter<A>::cp_attention_backward(LayerState<A>& ls, const Tensor& dout, Tensor& dqkv) {
  const std::int64_t c = cp_chunk_tokens(), width = 2 * KVl * d;
  ls.dkv = Tensor(be, ls.kv.size());  // zeros
  Tensor part(be, static_cast<std::size_t>(m.seq_len * width), kUninitialized);
  for (std::int64_t b = 0; b < prog.micro_batch; ++b) {
    for (std::int64_t piece = 0; piece < 2; ++piece) {
      const std::int64_t rows = (b * 2 + piece) * c, chunk = cp_chunk(piece);
      const A* keys = ls.kv.data() + b * m.seq_len * width;
      // The kernel writes the gradients of the keys it saw ((chunk + 1) * c of them); the two chunks of a sequence
      // see overlapping keys, so each adds its part.
      kern.attention_backward(chunk_shape(chunk, c, Hl, KVl, d, qkv_cols, width), ls.qkv.data() + rows * qkv_cols, keys,
                              keys + KVl * d, ls.o.data() + rows * Hl * d, ls.lse.data() + rows * Hl,
                              dout.data() + rows * Hl * d, dqkv.data() + rows * qkv_cols, part.data(),
                              part.data() + KVl * d, nullptr);
      A* into = ls.dkv.data() + b * m.seq_len * width;
      kern.residual_add((chunk + 1) * c * width, into, part.data(), into);
    }
  }
  ls.kv.clear();
}

// This file's members for both activation types (interpreter.h).
#define DTRAIN_INSTANTIATE_CONTEXT_PARALLEL(A)                                                             \
  template std::vector<std::int32_t> Interpreter<A>::local_tokens(const std::vector<std::int32_t>&) const; \
  template void Interpreter<A>::rope(bool, Tensor&);                                                       \
  template void Interpreter<A>::copy_kv_columns(Tensor&, Tensor&, bool);                                   \
  template void Interpreter<A>::reorder_kv_chunks(Tensor&, Tensor&, bool);                                 \
  template void Interpreter<A>::kv_gather(const Instr&, ChunkState<A>&, Tensor&, Tensor&);                 \
  template void Interpreter<A>::kv_grad_scatter(const Instr&, ChunkState<A>&, Tensor&);                    \
  template void Interpreter<A>::cp_attention_forward(LayerState<A>&);                                      \
  template void Interpreter<A>::cp_attention_backward(LayerState<A>&, const Tensor&, Tensor&);
DTRAIN_INSTANTIATE_CONTEXT_PARALLEL(float)
DTRAIN_INSTANTIATE_CONTEXT_PARALLEL(bf16)
#undef DTRAIN_INSTANTIATE_CONTEXT_PARALLEL

}  // namespace dtrain::exec::detail
