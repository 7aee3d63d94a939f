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
void Interpreter<A>::trade_heads(int layer, std::string_view what, const HeadColumns& cols, const Tensor& from,
                                 Tensor& to, bool to_heads) {
  const std::int64_t width = cols.width(), part = T * width;
  const auto bytes = [](std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(A); };
  // Row r of a row-split tensor against cp rank j's group of its columns, packed side by side.
  auto copy_groups = [&](std::int64_t j, const A* src, A* dst, bool src_is_row) {
    for (auto [first, w] : cols.groups) {
      if (src_is_row) {
        be.copy(dst, src + first + j * w, bytes(w));
        dst += w;
      } else {
        be.copy(dst + first + j * w, src, bytes(w));
        src += w;
      }
    }
  };
  // Part j: to the heads, rank j's group of this rank's rows; back, this rank's group of rank j's rows (whole rows
  // of the head-split tensor, at their positions).
  Tensor out(be, static_cast<std::size_t>(prog.cp * part), kUninitialized), got(be, out.size(), kUninitialized);
  for (std::int64_t j = 0; j < prog.cp; ++j) {
    for (std::int64_t r = 0; r < T; ++r) {
      A* packed = out.data() + j * part + r * width;
      if (to_heads)
        copy_groups(j, from.data() + r * cols.stride, packed, true);
      else
        be.copy(packed, from.data() + head_position(j, r) * width, bytes(width));
    }
  }
  trade_parts(layer, what, out, got);
  // Part j: to the heads, rank j's rows of this rank's group, placed at their positions; back, rank j's group of
  // this rank's rows.
  for (std::int64_t j = 0; j < prog.cp; ++j) {
    for (std::int64_t r = 0; r < T; ++r) {
      const A* packed = got.data() + j * part + r * width;
      if (to_heads)
        be.copy(to.data() + head_position(j, r) * width, packed, bytes(width));
      else
        copy_groups(j, packed, to.data() + r * cols.stride, false);
    }
  }
}

template <typename A>
typename Interpreter<A>::HeadSplit Interpreter<A>::head_split_qkv(LayerState<A>& ls, int layer) {
  const std::int64_t hq = Hl / prog.cp, hk = KVl / prog.cp, width = (hq + 2 * hk) * d;
  HeadSplit out{Tensor(be, static_cast<std::size_t>(prog.micro_batch * m.seq_len * width), kUninitialized),
                {prog.micro_batch, m.seq_len, hq, hk, d, width, width}};
  trade_heads(layer, "qkv", qkv_head_columns(), ls.qkv, out.qkv, true);
  return out;
}

template <typename A>
void Interpreter<A>::heads_attention_forward(LayerState<A>& ls, int layer) {
  const HeadSplit split = head_split_qkv(ls, layer);
  const std::int64_t hq = split.shape.n_heads, hk = split.shape.n_kv_heads;
  Tensor o(be, split.qkv.size() / static_cast<std::size_t>(hq + 2 * hk) * static_cast<std::size_t>(hq), kUninitialized);
  const A* q = split.qkv.data();
  kern.attention_forward(split.shape, q, q + hq * d, q + (hq + hk) * d, o.data(), ls.lse.data(), nullptr);
  trade_heads(layer, "o", output_head_columns(), o, ls.o, false);
}

template <typename A>
void Interpreter<A>::heads_attention_backward(LayerState<A>& ls, int layer, const Tensor& dout, Tensor& dqkv) {
  const HeadSplit split = head_split_qkv(ls, layer);
  const std::int64_t hq = split.shape.n_heads, hk = split.shape.n_kv_heads;
  const HeadColumns o_cols = output_head_columns();
  Tensor o(be, split.qkv.size() / static_cast<std::size_t>(hq + 2 * hk) * static_cast<std::size_t>(hq), kUninitialized);
  Tensor dout_h(be, o.size(), kUninitialized);
  trade_heads(layer, "o", o_cols, ls.o, o, true);
  trade_heads(layer, "do", o_cols, dout, dout_h, true);
  Tensor dqkv_h(be, split.qkv.size(), kUninitialized);
  const A* q = split.qkv.data();
  A* dq = dqkv_h.data();
  kern.attention_backward(split.shape, q, q + hq * d, q + (hq + hk) * d, o.data(), ls.lse.data(), dout_h.data(), dq,
                          dq + hq * d, dq + (hq + hk) * d, nullptr);
  trade_heads(layer, "dqkv", qkv_head_columns(), dqkv_h, dqkv, false);
}

// This file's members for both activation types (interpreter.h).
#define DTRAIN_INSTANTIATE_CP_HEADS(A)                                                                                \
  template void Interpreter<A>::heads_exchange(const Instr&, ChunkState<A>&);                                         \
  template typename Interpreter<A>::HeadColumns Interpreter<A>::qkv_head_columns() const;                             \
  template typename Interpreter<A>::HeadColumns Interpreter<A>::output_head_columns() const;                          \
  template std::int64_t Interpreter<A>::head_position(std::int64_t, std::int64_t) const;                              \
  template void Interpreter<A>::trade_parts(int, std::string_view, const Tensor&, Tensor&);                           \
  template void Interpreter<A>::trade_heads(int, std::string_view, const HeadColumns&, const Tensor&, Tensor&, bool); \
  template typename Interpreter<A>::HeadSplit Interpreter<A>::head_split_qkv(LayerState<A>&, int);                    \
  template void Interpreter<A>::heads_attention_forward(LayerState<A>&, int);                                         \
  template void Interpreter<A>::heads_attention_backward(LayerState<A>&, int, const Tensor&, Tensor&);
DTRAIN_INSTANTIATE_CP_HEADS(float)
DTRAIN_INSTANTIATE_CP_HEADS(bf16)
#undef DTRAIN_INSTANTIATE_CP_HEADS

}  // namespace dtrain::exec::detail
