// Context parallelism's all-to-all of the heads (cp_comm = a2a; DeepSpeed-Ulysses, Megatron's "a2a" CP): around the
// attention, the cp ranks trade sequence chunks for head groups. Before it each rank sends every other rank its rows
// (its two chunks of every sequence) of that rank's group of heads: cp rank j takes query heads [j hq, (j+1) hq) and
// key/value heads [j hk, (j+1) hk) of this tensor-parallel rank's (hq = heads/cp, hk = kv_heads/cp). Each rank then
// holds whole sequences, in position order, for its head group and runs the ordinary causal attention over them; the
// output goes back to the chunks' ranks. The backward exchanges the queries, keys and values again (the forward's are
// not kept), the output and its gradient, and sends the gradients of the queries, keys and values back.
//
// Memory: the head-split copies live only inside the attention (ls.qkv, ls.o hold this rank's rows as without cp;
// ls.lse holds the head group's log-sum-exps, the same count). RoPE ran on the rows before, at their positions.
#include <fmt/format.h>

#include "dtrain/kernels/attention.h"
#include "interpreter.h"

namespace dtrain::exec::detail {

namespace k = dtrain::kernels;
using ir::Instr;

template <typename A>
void Interpreter<A>::heads_exchange(const Instr& in, ChunkState<A>& st) {
  const std::int64_t hq = Hl / prog.cp, hk = KVl / prog.cp;
  if (hq * prog.cp != Hl || hk * prog.cp != KVl) {
    throw input_error(
        fmt::format("ALLTOALL on=cp what=heads layer={}: cp={} does not divide the {} heads and {} "
                    "key/value heads of this rank",
                    in.layer, prog.cp, Hl, KVl));
  }
  check_count(in, T * (hq + 2 * hk) * d);
  if (!be.host_accessible()) {
    throw input_error(
        fmt::format("ALLTOALL on=cp layer={}: the {} backend does not run context parallelism", in.layer, be.name()));
  }
  layer_state(st, in.layer).heads = true;  // the attention that follows runs on head groups
}

template <typename A>
typename Interpreter<A>::HeadColumns Interpreter<A>::qkv_head_columns() const {
  const std::int64_t hq = Hl / prog.cp, hk = KVl / prog.cp;
  return {qkv_cols, {{0, hq * d}, {Hl * d, hk * d}, {(Hl + KVl) * d, hk * d}}};
}

template <typename A>
typename Interpreter<A>::HeadColumns Interpreter<A>::output_head_columns() const {
  return {Hl * d, {{0, Hl / prog.cp * d}}};
}

template <typename A>
std::int64_t Interpreter<A>::head_position(std::int64_t rank, std::int64_t r) const {
  const std::int64_t c = cp_chunk_tokens(), b = r / (2 * c), piece = (r / c) % 2, i = r % c;
  return b * m.seq_len + cp_chunk_of(rank, piece) * c + i;
}

template <typename A>
void Interpreter<A>::trade_parts(int layer, std::string_view what, const Tensor& out, Tensor& got) {
  const auto part = out.size() / static_cast<std::size_t>(prog.cp);
  const int self = prog.cp_rank;
  const comm::Tag tag = comm::message_tag(fmt::format("cp a2a {} layer={}", what, layer));
  std::vector<comm::P2POp> ops;
  for (int j = 0; j < prog.cp; ++j) {
    if (j == self) continue;
    ops.push_back(comm::P2POp::send(out.data() + j * part, part, kAct, j, tag));
    ops.push_back(comm::P2POp::recv(got.data() + j * part, part, kAct, j, tag));
  }
  be.copy(got.data() + self * part, out.data() + self * part, part * sizeof(A));
  communicate(*comms.cp, [&] { comms.cp->group(ops); });
}

template <typename A>
void Interpreter<A>::rows_to_heads(int layer, std::string_view what, const HeadColumns& cols, const Tensor& rows_t,
                                   Tensor& heads_t) {
  const A* rows = rows_t.data();
  A* heads = heads_t.data();
  const std::int64_t width = cols.width(), part = T * width;
  Tensor out(be, static_cast<std::size_t>(prog.cp * part), kUninitialized), got(be, out.size(), kUninitialized);
  // Part j: cp rank j's group of columns of this rank's rows.
  for (std::int64_t j = 0; j < prog.cp; ++j) {
    for (std::int64_t r = 0; r < T; ++r) {
      A* into = out.data() + j * part + r * width;
      for (auto [first, w] : cols.groups) {
        be.copy(into, rows + r * cols.stride + first + j * w, static_cast<std::size_t>(w) * sizeof(A));
        into += w;
      }
    }
  }
  trade_parts(layer, what, out, got);
  // Part j: cp rank j's rows of this rank's group, placed at their positions.
  for (std::int64_t j = 0; j < prog.cp; ++j) {
    for (std::int64_t r = 0; r < T; ++r) {
      be.copy(heads + head_position(j, r) * width, got.data() + j * part + r * width,
              static_cast<std::size_t>(width) * sizeof(A));
    }
  }
}

template <typename A>
void Interpreter<A>::heads_to_rows(int layer, std::string_view what, const HeadColumns& cols, const Tensor& heads_t,
                                   Tensor& rows_t) {
  const A* heads = heads_t.data();
  A* rows = rows_t.data();
  const std::int64_t width = cols.width(), part = T * width;
  Tensor out(be, static_cast<std::size_t>(prog.cp * part), kUninitialized), got(be, out.size(), kUninitialized);
  // Part j: this rank's group of columns of cp rank j's rows.
  for (std::int64_t j = 0; j < prog.cp; ++j) {
    for (std::int64_t r = 0; r < T; ++r) {
      be.copy(out.data() + j * part + r * width, heads + head_position(j, r) * width,
              static_cast<std::size_t>(width) * sizeof(A));
    }
  }
  trade_parts(layer, what, out, got);
  // Part j: cp rank j's group of columns of this rank's rows.
  for (std::int64_t j = 0; j < prog.cp; ++j) {
    for (std::int64_t r = 0; r < T; ++r) {
      const A* from = got.data() + j * part + r * width;
      for (auto [first, w] : cols.groups) {
        be.copy(rows + r * cols.stride + first + j * w, from, static_cast<std::size_t>(w) * sizeof(A));
        from += w;
      }
    }
  }
}

template <typename A>
void Interpreter<A>::heads_attention_forward(LayerState<A>& ls, int layer) {
  const std::int64_t hq = Hl / prog.cp, hk = KVl / prog.cp, rows = prog.micro_batch * m.seq_len;
  const HeadColumns qkv_cols_h = qkv_head_columns(), o_cols = output_head_columns();
  const std::int64_t width = (hq + 2 * hk) * d;
  Tensor qkv(be, static_cast<std::size_t>(rows * width), kUninitialized);
  rows_to_heads(layer, "qkv", qkv_cols_h, ls.qkv, qkv);
  Tensor o(be, static_cast<std::size_t>(rows * hq * d), kUninitialized);
  const k::AttentionShape shape{prog.micro_batch, m.seq_len, hq, hk, d, width, width};
  kern.attention_forward(shape, qkv.data(), qkv.data() + hq * d, qkv.data() + (hq + hk) * d, o.data(), ls.lse.data(),
                         nullptr);
  heads_to_rows(layer, "o", o_cols, o, ls.o);
}

template <typename A>
void Interpreter<A>::heads_attention_backward(LayerState<A>& ls, int layer, const Tensor& dout, Tensor& dqkv) {
  const std::int64_t hq = Hl / prog.cp, hk = KVl / prog.cp, rows = prog.micro_batch * m.seq_len;
  const HeadColumns qkv_cols_h = qkv_head_columns(), o_cols = output_head_columns();
  const std::int64_t width = (hq + 2 * hk) * d;
  Tensor qkv(be, static_cast<std::size_t>(rows * width), kUninitialized);
  rows_to_heads(layer, "qkv", qkv_cols_h, ls.qkv, qkv);
  Tensor o(be, static_cast<std::size_t>(rows * hq * d), kUninitialized);
  Tensor dout_h(be, o.size(), kUninitialized);
  rows_to_heads(layer, "o", o_cols, ls.o, o);
  rows_to_heads(layer, "do", o_cols, dout, dout_h);
  Tensor dqkv_h(be, qkv.size(), kUninitialized);
  const k::AttentionShape shape{prog.micro_batch, m.seq_len, hq, hk, d, width, width};
  const A* q = qkv.data();
  kern.attention_backward(shape, q, q + hq * d, q + (hq + hk) * d, o.data(), ls.lse.data(), dout_h.data(),
                          dqkv_h.data(), dqkv_h.data() + hq * d, dqkv_h.data() + (hq + hk) * d, nullptr);
  heads_to_rows(layer, "dqkv", qkv_cols_h, dqkv_h, dqkv);
}

// This file's members for both activation types (interpreter.h).
#define DTRAIN_INSTANTIATE_CP_HEADS(A)                                                                            \
  template void Interpreter<A>::heads_exchange(const Instr&, ChunkState<A>&);                                     \
  template typename Interpreter<A>::HeadColumns Interpreter<A>::qkv_head_columns() const;                         \
  template typename Interpreter<A>::HeadColumns Interpreter<A>::output_head_columns() const;                      \
  template std::int64_t Interpreter<A>::head_position(std::int64_t, std::int64_t) const;                          \
  template void Interpreter<A>::trade_parts(int, std::string_view, const Tensor&, Tensor&);                       \
  template void Interpreter<A>::rows_to_heads(int, std::string_view, const HeadColumns&, const Tensor&, Tensor&); \
  template void Interpreter<A>::heads_to_rows(int, std::string_view, const HeadColumns&, const Tensor&, Tensor&); \
  template void Interpreter<A>::heads_attention_forward(LayerState<A>&, int);                                     \
  template void Interpreter<A>::heads_attention_backward(LayerState<A>&, int, const Tensor&, Tensor&);
DTRAIN_INSTANTIATE_CP_HEADS(float)
DTRAIN_INSTANTIATE_CP_HEADS(bf16)
#undef DTRAIN_INSTANTIATE_CP_HEADS

}  // namespace dtrain::exec::detail
