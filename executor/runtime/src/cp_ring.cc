// Context parallelism's ring exchange (cp_comm = p2p; Megatron's "p2p" CP, after Liu et al.'s ring attention): each
// rank's keys and values (its two chunks of every sequence, one block of T rows) travel around the cp ranks, one hop
// per step, and the attention runs over the block in hand while the next one arrives. A rank holds two blocks in the
// forward, and in the backward four and its own part of the held block's gradients and its queries' gradients (fp32),
// whatever cp is, where the all-gather (context_parallel.cc) holds the whole sequences' (CostModel::cp_transient_bytes
// prices these).
//
// Forward, cp steps: at step s this rank holds the block of cp rank (cp_rank - s) mod cp. Each of its query chunks
// attends to each of the block's key chunks that is not after it: the block's own chunk causally (the diagonal), an
// earlier chunk wholly; each such part gives an output and its log-sum-exp, merged into the running output as the
// online softmax does (o = sum of exp(lse_part - lse) o_part). The step's exchange (this block to the next rank, the
// next block from the previous one) runs on a thread of its own beside that attention.
//
// Backward, cp steps over the blocks again, with the final output and log-sum-exp: each part gives its queries'
// gradients (summed here) and its keys' and values' gradients. A block's gradients travel one step behind the block:
// at step s this rank sends on the summed gradients of the block it held at step s - 1 and receives those of the
// block it holds now from the ranks that held it before, adds its own part, and sends that on at step s + 1. After
// the last step it holds the sums of the block of rank cp_rank + 1, which the RING what=kv_grad instruction sends
// home, receiving its own block's.
#include <fmt/format.h>

#include <cmath>
#include <future>
#include <limits>

#include "dtrain/kernels/attention.h"
#include "interpreter.h"

namespace dtrain::exec::detail {

namespace k = dtrain::kernels;
using ir::Instr;
using ir::What;

// One ring step's messages, posted as one group on a thread of their own while the caller computes. wait() returns
// once they completed and rethrows a communication error; the destructor waits too, so that no message outlives its
// buffers. (Outside the anonymous namespace: the unity build's lambdas capture it.)
class RingStep {
 public:
  RingStep(comm::Communicator& cp, std::vector<comm::P2POp> ops) : cp_(cp), ops_(std::move(ops)) {
    if (!ops_.empty()) done_ = std::async(std::launch::async, [this] { cp_.group(ops_); });
  }
  RingStep(const RingStep&) = delete;
  RingStep& operator=(const RingStep&) = delete;
  ~RingStep() {
    if (done_.valid()) done_.wait();
  }
  void wait() {
    if (done_.valid()) done_.get();
  }

 private:
  comm::Communicator& cp_;
  std::vector<comm::P2POp> ops_;
  std::future<void> done_;
};

namespace {

float widen_value(float x) { return x; }
float widen_value(bf16 x) { return from_bf16(x); }
template <typename A>
A narrow_value(float x) {
  if constexpr (std::is_same_v<A, float>)
    return x;
  else
    return to_bf16(x);
}

// The attention of one query chunk (chunk qc) over one key chunk (kc <= qc) of c tokens: causal on the diagonal,
// every key before it otherwise (the kernel's queries past the last key see them all).
k::AttentionShape block_shape(std::int64_t qc, std::int64_t kc, std::int64_t c, std::int64_t heads,
                              std::int64_t kv_heads, std::int64_t d, std::int64_t q_stride, std::int64_t kv_stride) {
  k::AttentionShape s{1, c, heads, kv_heads, d, q_stride, kv_stride};
  s.q_rows = c;
  s.q_offset = kc == qc ? 0 : c;
  return s;
}

}  // namespace

template <typename A>
void Interpreter<A>::kv_ring(const Instr& in, ChunkState<A>& st, Tensor& cur) {
  LayerState<A>& ls = layer_state(st, in.layer);
  const auto block = static_cast<std::size_t>(T * 2 * KVl * d);
  check_count(in, static_cast<std::int64_t>(block));
  if (!be.host_accessible()) {
    throw input_error(
        fmt::format("RING on=cp layer={}: the {} backend does not run context parallelism", in.layer, be.name()));
  }
  if (in.what == What::kKv) {
    ls.ring = true;  // the attention that follows runs the ring
    return;
  }
  if (ls.dkv.size() != block) {
    throw input_error(
        fmt::format("RING on=cp what=kv_grad layer={}: no attention backward ran the ring before it", in.layer));
  }
  const int next = (prog.cp_rank + 1) % prog.cp, prev = (prog.cp_rank + prog.cp - 1) % prog.cp;
  const comm::Tag tag = comm::message_tag(fmt::format("cp ring kv_grad layer={} home", in.layer));
  Tensor mine(be, block, kUninitialized);
  const std::vector<comm::P2POp> ops{comm::P2POp::send(ls.dkv.data(), block, kAct, next, tag),
                                     comm::P2POp::recv(mine.data(), block, kAct, prev, tag)};
  communicate(*comms.cp, [&] { comms.cp->group(ops); });
  ls.dkv.clear();
  copy_kv_columns(cur, mine, false);
}

template <typename A>
std::vector<comm::P2POp> Interpreter<A>::ring_step_ops(int layer, std::int64_t step, Tensor* send_kv, Tensor* recv_kv,
                                                       Tensor* send_grad, Tensor* recv_grad) const {
  const int next = (prog.cp_rank + 1) % prog.cp, prev = (prog.cp_rank + prog.cp - 1) % prog.cp;
  std::vector<comm::P2POp> ops;
  auto pair = [&](Tensor* send, Tensor* recv, std::string_view what) {
    if (send == nullptr) return;
    const comm::Tag tag = comm::message_tag(fmt::format("cp ring {} layer={} step={}", what, layer, step));
    ops.push_back(comm::P2POp::send(send->data(), send->size(), kAct, next, tag));
    ops.push_back(comm::P2POp::recv(recv->data(), recv->size(), kAct, prev, tag));
  };
  pair(send_kv, recv_kv, "kv");
  pair(send_grad, recv_grad, "kv_grad");
  return ops;
}

template <typename A>
template <typename Fn>
void Interpreter<A>::for_each_ring_part(std::int64_t step, Fn&& fn) const {
  const std::int64_t c = cp_chunk_tokens(), cp = prog.cp;
  const std::int64_t owner = (prog.cp_rank - step + cp) % cp;
  for (std::int64_t b = 0; b < prog.micro_batch; ++b) {
    for (std::int64_t piece = 0; piece < 2; ++piece) {
      for (std::int64_t key_piece = 0; key_piece < 2; ++key_piece) {
        const std::int64_t qc = cp_chunk(piece), kc = cp_chunk_of(owner, key_piece);
        if (kc > qc) continue;  // keys after every query of the chunk
        fn(block_shape(qc, kc, c, Hl, KVl, d, qkv_cols, 2 * KVl * d), (b * 2 + piece) * c, (b * 2 + key_piece) * c);
      }
    }
  }
}

template <typename A>
void Interpreter<A>::ring_attention_forward(LayerState<A>& ls, int layer) {
  const std::int64_t c = cp_chunk_tokens(), width = 2 * KVl * d, od = Hl * d;
  const auto block = static_cast<std::size_t>(T * width);
  Tensor held(be, block, kUninitialized), arriving(be, block, kUninitialized);
  copy_kv_columns(ls.qkv, held, true);
  F32 out(be, static_cast<std::size_t>(T * od));  // zeros
  be.fill(T * Hl, -std::numeric_limits<float>::infinity(), ls.lse.data());
  Tensor part(be, static_cast<std::size_t>(c * od), kUninitialized);
  F32 part_lse(be, static_cast<std::size_t>(c * Hl), kUninitialized);
  for (std::int64_t s = 0; s < prog.cp; ++s) {
    RingStep exchange(*comms.cp, s + 1 < prog.cp ? ring_step_ops(layer, s, &held, &arriving, nullptr, nullptr)
                                                 : std::vector<comm::P2POp>{});
    for_each_ring_part(s, [&](const k::AttentionShape& shape, std::int64_t q_row, std::int64_t k_row) {
      const A* keys = held.data() + k_row * width;
      kern.attention_forward(shape, ls.qkv.data() + q_row * qkv_cols, keys, keys + KVl * d, part.data(),
                             part_lse.data(), nullptr);
      // The part's rows merged into the running output: lse = log(exp(lse) + exp(lse_part)).
      for (std::int64_t head = 0; head < Hl; ++head) {
        for (std::int64_t i = 0; i < c; ++i) {
          float& lse = ls.lse.data()[q_row * Hl + head * c + i];
          const float lp = part_lse.data()[head * c + i];
          const float merged = std::isinf(lse) ? lp : std::max(lse, lp) + std::log1p(std::exp(-std::abs(lse - lp)));
          const float keep = std::isinf(lse) ? 0.0f : std::exp(lse - merged), add = std::exp(lp - merged);
          float* o = out.data() + (q_row + i) * od + head * d;
          const A* op = part.data() + i * od + head * d;
          for (std::int64_t j = 0; j < d; ++j) o[j] = keep * o[j] + add * widen_value(op[j]);
          lse = merged;
        }
      }
    });
    communicate(*comms.cp, [&] { exchange.wait(); });
    held.swap(arriving);
  }
  kern.from_fp32(T * od, out.data(), ls.o.data());
}

template <typename A>
void Interpreter<A>::ring_attention_backward(LayerState<A>& ls, int layer, const Tensor& dout, Tensor& dqkv) {
  const std::int64_t c = cp_chunk_tokens(), width = 2 * KVl * d, od = Hl * d;
  const auto block = static_cast<std::size_t>(T * width);
  Tensor held(be, block, kUninitialized), arriving(be, block, kUninitialized);
  copy_kv_columns(ls.qkv, held, true);
  // The summed gradients of the block held at the previous step (sent on) and of the one held now (from the ranks
  // that held it before); this rank's part of the latter.
  Tensor sent(be, block, kUninitialized), received(be, block, kUninitialized);
  F32 own(be, block, kUninitialized);
  F32 dq(be, static_cast<std::size_t>(T * od));  // zeros
  Tensor dq_part(be, static_cast<std::size_t>(c * qkv_cols), kUninitialized);
  Tensor dkv_part(be, static_cast<std::size_t>(c * width), kUninitialized);
  for (std::int64_t s = 0; s < prog.cp; ++s) {
    RingStep exchange(*comms.cp, ring_step_ops(layer, s, s + 1 < prog.cp ? &held : nullptr, &arriving,
                                               s > 0 ? &sent : nullptr, &received));
    be.fill(static_cast<std::int64_t>(block), 0.0f, own.data());
    for_each_ring_part(s, [&](const k::AttentionShape& shape, std::int64_t q_row, std::int64_t k_row) {
      const A* keys = held.data() + k_row * width;
      kern.attention_backward(shape, ls.qkv.data() + q_row * qkv_cols, keys, keys + KVl * d, ls.o.data() + q_row * od,
                              ls.lse.data() + q_row * Hl, dout.data() + q_row * od, dq_part.data(), dkv_part.data(),
                              dkv_part.data() + KVl * d, nullptr);
      for (std::int64_t i = 0; i < c; ++i) {
        float* into = dq.data() + (q_row + i) * od;
        const A* from = dq_part.data() + i * qkv_cols;
        for (std::int64_t j = 0; j < od; ++j) into[j] += widen_value(from[j]);
      }
      float* into = own.data() + k_row * width;
      const A* part = dkv_part.data();
      for (std::int64_t j = 0; j < c * width; ++j) into[j] += widen_value(part[j]);
    });
    communicate(*comms.cp, [&] { exchange.wait(); });
    A* sums = sent.data();
    for (std::size_t j = 0; j < block; ++j) {
      sums[j] = narrow_value<A>(own.data()[j] + (s > 0 ? widen_value(received.data()[j]) : 0.0f));
    }
    held.swap(arriving);
  }
  ls.dkv = std::move(sent);  // the last block's sums, for RING what=kv_grad
  for (std::int64_t r = 0; r < T; ++r) kern.from_fp32(od, dq.data() + r * od, dqkv.data() + r * qkv_cols);
}

// This file's members for both activation types (interpreter.h).
#define DTRAIN_INSTANTIATE_CP_RING(A)                                                                           \
  template void Interpreter<A>::kv_ring(const Instr&, ChunkState<A>&, Tensor&);                                 \
  template std::vector<comm::P2POp> Interpreter<A>::ring_step_ops(int, std::int64_t, Tensor*, Tensor*, Tensor*, \
                                                                  Tensor*) const;                               \
  template void Interpreter<A>::ring_attention_forward(LayerState<A>&, int);                                    \
  template void Interpreter<A>::ring_attention_backward(LayerState<A>&, int, const Tensor&, Tensor&);
DTRAIN_INSTANTIATE_CP_RING(float)
DTRAIN_INSTANTIATE_CP_RING(bf16)
#undef DTRAIN_INSTANTIATE_CP_RING

}  // namespace dtrain::exec::detail
