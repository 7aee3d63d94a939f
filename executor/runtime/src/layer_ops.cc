// The stage-body ops of the interpreter (interpreter.h): forward, backward and recomputation of each ir::BodyOp, and
// the tensor-parallel collectives inside a body. A "current tensor" flows through a body's COMPUTE ops (each calls a
// kernel and keeps in the pass state what its backward needs); the body's collectives transform it (all-gather:
// sequence shard -> full; reduce-scatter: partial sums -> reduced shard; all-reduce: in place).
#include <fmt/format.h>

#include "dtrain/kernels/attention.h"
#include "interpreter.h"

namespace dtrain::exec::detail {

namespace k = dtrain::kernels;
using ir::BodyOp;
using ir::Instr;
using ir::Opcode;
using ir::What;

namespace {

// The column-parallel ops whose weight gradient reads an input re-gathered over the sequence (sequence parallelism).
bool uses_gathered(BodyOp op) { return op == BodyOp::kAttnQkv || op == BodyOp::kMlpFc1 || op == BodyOp::kHeadLogits; }

[[noreturn]] void no_body_op(const Instr& in) {
  throw internal_error(fmt::format("a COMPUTE instruction without an op: {}", ir::to_text(in)));
}

}  // namespace

template <typename A>
void Interpreter<A>::all_gather_rows(Tensor& t, std::int64_t cols) {
  Tensor full(be, static_cast<std::size_t>(T * cols));
  communicate(*comms.tp,
              [&] { comms.tp->all_gather(t.data(), full.data(), static_cast<std::size_t>(Tl * cols), kAct); });
  t.swap(full);
}

template <typename A>
void Interpreter<A>::reduce_scatter_rows(Tensor& t, std::int64_t cols) {
  Tensor part(be, static_cast<std::size_t>(Tl * cols));
  communicate(*comms.tp, [&] {
    comms.tp->reduce_scatter(t.data(), part.data(), static_cast<std::size_t>(Tl * cols), kAct, comm::ReduceOp::kSum);
  });
  t.swap(part);
}

template <typename A>
void Interpreter<A>::norm_forward(const std::string& prefix, const Tensor& x, Tensor& y, F32& a, F32& b) {
  std::int64_t rows = static_cast<std::int64_t>(x.size()) / h;
  sized(y, x.size(), kUninitialized);
  k::NormShape shape{rows, h};
  if (m.norm == model::NormKind::kLayerNorm) {
    sized(a, static_cast<std::size_t>(rows), kUninitialized);
    sized(b, static_cast<std::size_t>(rows), kUninitialized);
    kern.layernorm_forward(shape, x.data(), P(prefix + ".weight"), P(prefix + ".bias"), static_cast<float>(m.norm_eps),
                           y.data(), a.data(), b.data());
  } else {
    sized(b, static_cast<std::size_t>(rows), kUninitialized);
    kern.rmsnorm_forward(shape, x.data(), P(prefix + ".weight"), static_cast<float>(m.norm_eps), y.data(), b.data());
  }
}

template <typename A>
void Interpreter<A>::norm_backward(const std::string& prefix, const Tensor& x, const F32& a, const F32& b, Tensor& dy) {
  std::int64_t rows = static_cast<std::int64_t>(x.size()) / h;
  Tensor dx(be, x.size(), kUninitialized);
  k::NormShape shape{rows, h};
  if (m.norm == model::NormKind::kLayerNorm) {
    kern.layernorm_backward(shape, x.data(), P(prefix + ".weight"), a.data(), b.data(), dy.data(), dx.data(),
                            G(prefix + ".weight"), G(prefix + ".bias"));
  } else {
    kern.rmsnorm_backward(shape, x.data(), P(prefix + ".weight"), b.data(), dy.data(), dx.data(),
                          G(prefix + ".weight"));
  }
  dy.swap(dx);
}

// out = residual + dropout(branch + bias), on the rows held here.
template <typename A>
void Interpreter<A>::residual_forward(const Tensor& residual, Tensor& branch, const A* bias, int layer,
                                      k::DropoutSite site) {
  std::int64_t rows = static_cast<std::int64_t>(branch.size()) / h;
  if (bias != nullptr) kern.add_bias_rows(rows, h, bias, branch.data());
  if (dropout_p() > 0) {
    Tensor out(be, branch.size());
    kern.dropout_add_forward(dropout_layout(), branch.data(), residual.data(), static_cast<float>(dropout_p()),
                             dropout_key(layer, site), out.data());
    branch.swap(out);
  } else {
    kern.residual_add(static_cast<std::int64_t>(branch.size()), branch.data(), residual.data(), branch.data());
  }
}

// Gradient through out = residual + dropout(branch + bias): keeps dout for the residual path, returns the branch's.
template <typename A>
void Interpreter<A>::residual_backward(Tensor& dout, Tensor& res_grad, float* dbias, int layer, k::DropoutSite site) {
  res_grad = dout;
  if (dropout_p() > 0) {
    kern.dropout_add_backward(dropout_layout(), dout.data(), static_cast<float>(dropout_p()), dropout_key(layer, site),
                              dout.data());
  }
  if (dbias != nullptr) kern.accumulate_bias_grad(static_cast<std::int64_t>(dout.size()) / h, h, dout.data(), dbias);
}

template <typename A>
k::AttentionDropout* Interpreter<A>::attention_dropout(k::AttentionDropout& drop, int layer) {
  if (dropout_p() <= 0) return nullptr;
  drop.p = static_cast<float>(dropout_p());
  drop.key = dropout_key(layer, k::DropoutSite::kAttentionProbs);
  drop.sample_begin = sample_base(step_.mb) - step_.index * opt.global_batch;
  drop.head_begin = prog.tp_rank * Hl;
  drop.total_heads = m.heads;
  return &drop;
}

template <typename A>
void Interpreter<A>::forward_op(const Instr& in, ChunkState<A>& st, Tensor& cur, bool recompute) {
  const int l = in.layer;
  HeadState<A>& hs = st.head;
  switch (in.body_op) {
    case BodyOp::kEmbedTokens:
      cur = Tensor(be, static_cast<std::size_t>(T * h));
      kern.embedding_forward(T, h, st.ids.data(), W("embed.tokens.weight"), vocab, cur.data());
      return;
    case BodyOp::kEmbedPositions: {
      std::int64_t rows = static_cast<std::int64_t>(cur.size()) / h;
      const A* pos = W("embed.positions.weight");
      for_each_sequence_piece(token_offset(rows), rows,
                              [&](std::int64_t, std::int64_t p0, std::int64_t len, std::int64_t row) {
                                kern.position_embedding_forward(1, len, h, pos + p0 * h, cur.data() + row * h);
                              });
      if (dropout_p() > 0) {
        Tensor zeros(be, cur.size()), out(be, cur.size());
        kern.dropout_add_forward(dropout_layout(), cur.data(), zeros.data(), static_cast<float>(dropout_p()),
                                 dropout_key(0, k::DropoutSite::kEmbedding), out.data());
        cur.swap(out);
      }
      return;
    }
    case BodyOp::kHeadNorm:
      hs.x = std::move(cur);
      norm_forward("head.norm", hs.x, hs.y, hs.na, hs.nb);
      cur = hs.y;
      return;
    case BodyOp::kHeadLogits:
      // The weight gradient's input is hs.y: the norm's output, which without sequence parallelism is this input.
      sized(hs.logits, static_cast<std::size_t>(T * (vocab.end - vocab.begin)), kUninitialized);
      kern.linear_forward({T, h, vocab.end - vocab.begin}, cur.data(), vocab_weight(), nullptr, hs.logits.data());
      return;
    case BodyOp::kHeadCrossEntropy: {
      // Vocab-parallel: index 0, 1, 2 are the steps between the body's all-reduces; -1 all of them (no TP).
      auto tokens = static_cast<std::size_t>(T);
      if (in.index <= 0) {
        sized(hs.max, tokens);
        kern.cross_entropy_max(T, hs.logits.data(), vocab, hs.max.data());
      }
      if (in.index < 0 || in.index == 1) {
        sized(hs.sum_exp, tokens);
        sized(hs.target_logit, tokens);
        kern.cross_entropy_sum_exp(T, hs.logits.data(), st.targets.data(), vocab, hs.max.data(), hs.sum_exp.data(),
                                   hs.target_logit.data());
      }
      if (in.index < 0 || in.index == 2) {
        F32 loss(be, tokens);
        be.cross_entropy_loss(T, hs.max.data(), hs.sum_exp.data(), hs.target_logit.data(), loss.data());
        if (prog.tp_rank == 0) {
          double sum = be.sum(T, loss.data());
          step_.loss_sum += sum / (static_cast<double>(opt.global_batch) * static_cast<double>(m.seq_len));
          if (!step_.token_losses.empty()) {
            // Each run of positions of this rank's tokens to its place in the batch (with context parallelism the
            // other chunks are the other cp ranks').
            const std::int64_t first = (sample_base(step_.mb) - step_.index * opt.global_batch) * m.seq_len;
            for_each_sequence_piece(
                0, T, [&](std::int64_t sample, std::int64_t pos, std::int64_t len, std::int64_t row) {
                  be.copy_to_host(step_.token_losses
                                      .subspan(static_cast<std::size_t>(first + sample * m.seq_len + pos),
                                               static_cast<std::size_t>(len))
                                      .data(),
                                  loss.data() + row, static_cast<std::size_t>(len) * sizeof(float));
                });
          }
        }
      }
      return;
    }
    case BodyOp::kAttnNorm: {
      LayerState<A>& ls = layer_state(st, l);
      ls.x = std::move(cur);
      norm_forward(L(l, "attn.norm"), ls.x, ls.y1, ls.n1a, ls.n1b);
      cur = ls.y1;
      return;
    }
    case BodyOp::kAttnQkv: {
      // The weight gradient's input is ls.y1, the norm's output: without sequence parallelism, this input itself;
      // with it, the shard that the backward gathers again.
      Tensor y(be, static_cast<std::size_t>(T * qkv_cols), kUninitialized);
      gemm.forward({T, h, qkv_cols}, cur.data(), W(L(l, "attn.qkv.weight")), W_opt(L(l, "attn.qkv.bias")), y.data());
      cur.swap(y);
      return;
    }
    case BodyOp::kAttnRope:
      rope(false, cur);
      return;
    case BodyOp::kAttnCore: {
      LayerState<A>& ls = layer_state(st, l);
      if (!recompute) ls.qkv = std::move(cur);
      const Tensor& qkv = ls.qkv;
      sized(ls.o, static_cast<std::size_t>(T * Hl * d), kUninitialized);
      sized(ls.lse, static_cast<std::size_t>(T * Hl), kUninitialized);
      if (prog.cp > 1) {
        if (ls.ring)
          ring_attention_forward(ls, l);
        else if (ls.heads)
          heads_attention_forward(ls, l);
        else if (!ls.kv.empty())
          cp_attention_forward(ls);
        else
          throw input_error(fmt::format("attn.core layer={}: cp = {} but no key/value exchange before it", l, prog.cp));
        if (in.pass == ir::Pass::kForward) {  // a recomputation keeps them (or the ring armed) for the backward
          ls.kv.clear();
          ls.ring = false;
          ls.heads = false;
        }
        if (!recompute) cur = ls.o;
        return;
      }
      k::AttentionShape shape{prog.micro_batch, m.seq_len, Hl, KVl, d, qkv_cols, qkv_cols};
      k::AttentionDropout drop;
      k::AttentionDropout* dp = attention_dropout(drop, l);
      kern.attention_forward(shape, qkv.data(), qkv.data() + Hl * d, qkv.data() + (Hl + KVl) * d, ls.o.data(),
                             ls.lse.data(), dp);
      if (!recompute) cur = ls.o;
      return;
    }
    case BodyOp::kAttnProj: {
      Tensor y(be, static_cast<std::size_t>(T * h), kUninitialized);
      gemm.forward({T, Hl * d, h}, cur.data(), W(L(l, "attn.proj.weight")), nullptr, y.data());
      cur.swap(y);
      return;
    }
    case BodyOp::kAttnResidual:
      residual_forward(layer_state(st, l).x, cur, W_opt(L(l, "attn.proj.bias")), l, k::DropoutSite::kAttentionOutput);
      return;
    case BodyOp::kMlpNorm: {
      LayerState<A>& ls = layer_state(st, l);
      ls.x2 = std::move(cur);
      norm_forward(L(l, "mlp.norm"), ls.x2, ls.y2, ls.n2a, ls.n2b);
      cur = ls.y2;
      return;
    }
    case BodyOp::kMlpFc1: {
      // The weight gradient's input is ls.y2 (as ls.y1 for the QKV projection).
      Tensor y(be, static_cast<std::size_t>(T * fc1_cols), kUninitialized);
      gemm.forward({T, h, fc1_cols}, cur.data(), W(L(l, "mlp.fc1.weight")), W_opt(L(l, "mlp.fc1.bias")), y.data());
      cur.swap(y);
      return;
    }
    case BodyOp::kMlpAct: {
      // The activation keeps its input (for its backward), fc2 its own input (for the weight gradient): each op
      // moves what it keeps into the layer's state rather than copying it.
      Tensor y;
      activation_forward(T, fl, cur, y);
      layer_state(st, l).a = std::move(cur);
      cur = std::move(y);
      return;
    }
    case BodyOp::kMlpFc2: {
      Tensor y(be, static_cast<std::size_t>(T * h), kUninitialized);
      gemm.forward({T, fl, h}, cur.data(), W(L(l, "mlp.fc2.weight")), nullptr, y.data());
      layer_state(st, l).g = std::move(cur);
      cur = std::move(y);
      return;
    }
    case BodyOp::kMlpResidual:
      residual_forward(layer_state(st, l).x2, cur, W_opt(L(l, "mlp.fc2.bias")), l, k::DropoutSite::kMlpOutput);
      return;
    case BodyOp::kMoeRoute:
    case BodyOp::kMoeExperts:
    case BodyOp::kMoeShared:
    case BodyOp::kMoeCombine:
      moe_forward(in, st, cur);
      return;
    case BodyOp::kNone:
      break;
  }
  no_body_op(in);
}

// A linear layer's backward: input gradient (pass bwd / bwd_i) and weight gradient (bwd / bwd_w).
template <typename A>
void Interpreter<A>::linear_backward(const Instr& in, LayerState<A>* ls, ChunkState<A>& st, Tensor& cur,
                                     std::int64_t in_features, std::int64_t out_features, const A* w, float* dw,
                                     float* db, const Tensor& saved_input) {
  bool input_grad = in.pass == ir::Pass::kBackward || in.pass == ir::Pass::kBackwardInput;
  bool weight_grad = in.pass == ir::Pass::kBackward || in.pass == ir::Pass::kBackwardWeight;
  k::LinearShape shape{T, in_features, out_features};
  const Tensor* dy = &cur;
  Tensor* stash = ls != nullptr ? &ls->dy[in.body_op] : &st.head.dy_logits;
  if (in.pass == ir::Pass::kBackwardWeight) dy = stash;
  LayerGemms<A>& g = ls != nullptr ? gemm : *plain_gemm;  // a layer's, or the output layer's
  if (weight_grad) {
    const Tensor& x = sp && !st.gathered.empty() && uses_gathered(in.body_op) ? st.gathered : saved_input;
    g.backward_weight(shape, dy->data(), x.data(), dw, db);
    if (uses_gathered(in.body_op)) st.gathered.clear();
  }
  if (in.pass == ir::Pass::kBackwardInput) *stash = cur;
  if (input_grad) {
    Tensor dx(be, static_cast<std::size_t>(T * in_features), kUninitialized);
    g.backward_input(shape, cur.data(), w, dx.data());
    cur.swap(dx);
  }
  if (in.pass == ir::Pass::kBackwardWeight) stash->clear();
}

template <typename A>
void Interpreter<A>::backward_op(const Instr& in, ChunkState<A>& st, Tensor& cur) {
  const int l = in.layer;
  HeadState<A>& hs = st.head;
  switch (in.body_op) {
    case BodyOp::kHeadCrossEntropy: {
      float dl = static_cast<float>(1.0 / (static_cast<double>(opt.global_batch) * static_cast<double>(m.seq_len)));
      F32 dloss(be, static_cast<std::size_t>(T), dl);
      sized(cur, hs.logits.size(), kUninitialized);
      kern.cross_entropy_backward(T, hs.logits.data(), st.targets.data(), vocab, hs.max.data(), hs.sum_exp.data(),
                                  dloss.data(), cur.data());
      return;
    }
    case BodyOp::kHeadLogits:
      linear_backward(in, nullptr, st, cur, h, vocab.end - vocab.begin, vocab_weight(), vocab_weight_grad(), nullptr,
                      hs.y);
      if (in.pass != ir::Pass::kBackwardWeight) hs.logits.clear();
      return;
    case BodyOp::kHeadNorm:
      norm_backward("head.norm", hs.x, hs.na, hs.nb, cur);
      return;
    case BodyOp::kEmbedPositions: {
      std::int64_t rows = static_cast<std::int64_t>(cur.size()) / h;
      if (dropout_p() > 0) {
        kern.dropout_add_backward(dropout_layout(), cur.data(), static_cast<float>(dropout_p()),
                                  dropout_key(0, k::DropoutSite::kEmbedding), cur.data());
      }
      float* dpos = G("embed.positions.weight");
      for_each_sequence_piece(token_offset(rows), rows,
                              [&](std::int64_t, std::int64_t p0, std::int64_t len, std::int64_t row) {
                                kern.position_embedding_backward(1, len, h, cur.data() + row * h, dpos + p0 * h);
                              });
      return;
    }
    case BodyOp::kEmbedTokens:
      kern.embedding_backward(T, h, st.ids.data(), cur.data(), vocab, G("embed.tokens.weight"));
      return;
    case BodyOp::kMlpResidual:
      residual_backward(cur, layer_state(st, l).res_grad, G_opt(L(l, "mlp.fc2.bias")), l, k::DropoutSite::kMlpOutput);
      return;
    case BodyOp::kMlpFc2: {
      LayerState<A>& ls = layer_state(st, l);
      linear_backward(in, &ls, st, cur, fl, h, W(L(l, "mlp.fc2.weight")), G(L(l, "mlp.fc2.weight")), nullptr, ls.g);
      return;
    }
    case BodyOp::kMlpAct:
      activation_backward(T, fl, layer_state(st, l).a, cur);
      return;
    case BodyOp::kMlpFc1: {
      LayerState<A>& ls = layer_state(st, l);
      linear_backward(in, &ls, st, cur, h, fc1_cols, W(L(l, "mlp.fc1.weight")), G(L(l, "mlp.fc1.weight")),
                      G_opt(L(l, "mlp.fc1.bias")), ls.y2);
      return;
    }
    case BodyOp::kMlpNorm: {
      LayerState<A>& ls = layer_state(st, l);
      norm_backward(L(l, "mlp.norm"), ls.x2, ls.n2a, ls.n2b, cur);
      kern.residual_add(static_cast<std::int64_t>(cur.size()), cur.data(), ls.res_grad.data(), cur.data());
      return;
    }
    case BodyOp::kAttnResidual:
      residual_backward(cur, layer_state(st, l).res_grad, G_opt(L(l, "attn.proj.bias")), l,
                        k::DropoutSite::kAttentionOutput);
      return;
    case BodyOp::kAttnProj: {
      LayerState<A>& ls = layer_state(st, l);
      linear_backward(in, &ls, st, cur, Hl * d, h, W(L(l, "attn.proj.weight")), G(L(l, "attn.proj.weight")), nullptr,
                      ls.o);
      return;
    }
    case BodyOp::kAttnCore: {
      LayerState<A>& ls = layer_state(st, l);
      Tensor dqkv(be, static_cast<std::size_t>(T * qkv_cols), kUninitialized);
      if (prog.cp > 1) {  // the keys' and values' columns come with kv_grad
        if (ls.ring)
          ring_attention_backward(ls, l, cur, dqkv);
        else if (ls.heads)
          heads_attention_backward(ls, l, cur, dqkv);
        else if (!ls.kv.empty())
          cp_attention_backward(ls, cur, dqkv);
        else
          throw input_error(
              fmt::format("attn.core layer={} backward: cp = {} but no key/value exchange before it", l, prog.cp));
        ls.ring = false;
        ls.heads = false;
        cur.swap(dqkv);
        return;
      }
      k::AttentionShape shape{prog.micro_batch, m.seq_len, Hl, KVl, d, qkv_cols, qkv_cols};
      k::AttentionDropout drop;
      k::AttentionDropout* dp = attention_dropout(drop, l);
      const A* q = ls.qkv.data();
      kern.attention_backward(shape, q, q + Hl * d, q + (Hl + KVl) * d, ls.o.data(), ls.lse.data(), cur.data(),
                              dqkv.data(), dqkv.data() + Hl * d, dqkv.data() + (Hl + KVl) * d, dp);
      cur.swap(dqkv);
      return;
    }
    case BodyOp::kAttnRope:
      rope(true, cur);
      return;
    case BodyOp::kAttnQkv: {
      LayerState<A>& ls = layer_state(st, l);
      linear_backward(in, &ls, st, cur, h, qkv_cols, W(L(l, "attn.qkv.weight")), G(L(l, "attn.qkv.weight")),
                      G_opt(L(l, "attn.qkv.bias")), ls.y1);
      return;
    }
    case BodyOp::kAttnNorm: {
      LayerState<A>& ls = layer_state(st, l);
      norm_backward(L(l, "attn.norm"), ls.x, ls.n1a, ls.n1b, cur);
      kern.residual_add(static_cast<std::int64_t>(cur.size()), cur.data(), ls.res_grad.data(), cur.data());
      // The layer's backward is done: its tensors go now, not with the chunk's state, so that a backward holds the
      // layers not yet done and not every one it recomputed. (A split backward keeps them for the weight pass.)
      if (in.pass == ir::Pass::kBackward) ls = LayerState<A>{};
      return;
    }
    case BodyOp::kMoeRoute:
    case BodyOp::kMoeExperts:
    case BodyOp::kMoeShared:
    case BodyOp::kMoeCombine:
      moe_backward(in, st, cur);
      return;
    case BodyOp::kNone:
      break;
  }
  no_body_op(in);
}

// Recomputation: a layer's forward again from its saved input (full), or the attention core (selective).
template <typename A>
void Interpreter<A>::recompute_op(const Instr& op, ChunkState<A>& st) {
  if (op.body_op == BodyOp::kAttnCore && !step_.recomputing) {
    forward_op(op, st, st.rcur, true);
    return;
  }
  if (op.body_op == BodyOp::kAttnNorm) st.rcur = layer_state(st, op.layer).x;
  step_.recomputing = true;
  forward_op(op, st, st.rcur, false);
  if (op.body_op == BodyOp::kMlpResidual) {
    step_.recomputing = false;
    st.rcur.clear();
  }
}

// With full recomputation a layer keeps only its input between forward and backward: its other tensors go as soon as
// its forward ends, so that the forward of a chunk holds one layer's intermediates at a time, as the cost model
// counts. Selective recomputation keeps everything the attention core's backward needs but recomputes it (the CPU
// kernel keeps no score matrix anyway).
template <typename A>
void Interpreter<A>::free_recomputed(LayerState<A>& ls) {
  if (!recompute_full) return;
  Tensor x = std::move(ls.x);
  ls = LayerState<A>{};
  ls.x = std::move(x);
}

// A tensor-parallel collective inside a body.
template <typename A>
void Interpreter<A>::body_collective(const Instr& in, ChunkState<A>& st, Tensor& cur, Tensor& rcur) {
  if (in.op == Opcode::kAllToAll && in.on == ir::CommGroup::kCp) {
    heads_exchange(in, st);
    return;
  }
  if (in.op == Opcode::kAllToAll) {
    moe_exchange(in, st);
    return;
  }
  if (in.on == ir::CommGroup::kDp || in.on == ir::CommGroup::kEdp) {
    fsdp_collective(in);
    return;
  }
  if (in.op == Opcode::kRing) {
    kv_ring(in, st, cur);
    return;
  }
  if (in.what == What::kRouterStats) {
    moe_router_stats(in, st);
    return;
  }
  if (in.what == What::kKv) {
    kv_gather(in, st, cur, rcur);
    return;
  }
  if (in.what == What::kKvGrad) {
    kv_grad_scatter(in, st, cur);
    return;
  }
  Tensor& t = in.pass == ir::Pass::kRecompute || step_.recomputing ? rcur : cur;
  comm::Communicator& tp = *comms.tp;
  auto all_reduce_fp32 = [&](F32& v, comm::ReduceOp op) {
    communicate(tp, [&] { tp.all_reduce(v.data(), v.data(), v.size(), op); });
  };
  switch (in.what) {
    case What::kHidden:
      if (in.op == Opcode::kAllGather)
        all_gather_rows(t, h);
      else if (in.op == Opcode::kReduceScatter)
        reduce_scatter_rows(t, h);
      else
        communicate(tp, [&] { tp.all_reduce(t.data(), t.data(), t.size(), kAct, comm::ReduceOp::kSum); });
      return;
    case What::kSavedInput: {
      const Tensor& shard = saved_input_for(in, st);
      sized(st.gathered, static_cast<std::size_t>(T * h));
      communicate(tp, [&] { tp.all_gather(shard.data(), st.gathered.data(), shard.size(), kAct); });
      return;
    }
    case What::kLogitsMax:
      all_reduce_fp32(st.head.max, comm::ReduceOp::kMax);
      return;
    case What::kLogitsSumExp:
      all_reduce_fp32(st.head.sum_exp, comm::ReduceOp::kSum);
      return;
    case What::kTargetLogit:
      all_reduce_fp32(st.head.target_logit, comm::ReduceOp::kSum);
      return;
    case What::kRouterGrad: {
      F32& dgate = layer_state(st, in.layer).moe.dgate;
      check_count(in, static_cast<std::int64_t>(dgate.size()));
      all_reduce_fp32(dgate, comm::ReduceOp::kSum);
      return;
    }
    default:
      throw internal_error(fmt::format("unexpected collective in a body: {}", ir::to_text(in)));
  }
}

// The saved (sequence-shard) input of the column-parallel op that follows a saved-input all-gather.
template <typename A>
const typename Interpreter<A>::Tensor& Interpreter<A>::saved_input_for(const Instr& in, ChunkState<A>& st) {
  if (const Instr* next = next_compute()) {
    if (next->body_op == BodyOp::kHeadLogits) return st.head.y;
    if (next->body_op == BodyOp::kAttnQkv) return layer_state(st, next->layer).y1;
    if (next->body_op == BodyOp::kMlpFc1) return layer_state(st, next->layer).y2;
  }
  throw internal_error(fmt::format("saved-input all-gather not followed by a column-parallel op: {}", ir::to_text(in)));
}

template <typename A>
const Instr* Interpreter<A>::next_compute() const {
  const ir::Body* body = step_.body;
  for (std::size_t i = step_.body_pc + 1; body != nullptr && i < body->instrs.size(); ++i) {
    if (body->instrs[i].op == Opcode::kCompute) return &body->instrs[i];
  }
  return nullptr;
}

// This file's members for both activation types (interpreter.h).
#define DTRAIN_INSTANTIATE_LAYER_OPS(A)                                                                              \
  template void Interpreter<A>::all_gather_rows(Tensor&, std::int64_t);                                              \
  template void Interpreter<A>::reduce_scatter_rows(Tensor&, std::int64_t);                                          \
  template void Interpreter<A>::norm_forward(const std::string&, const Tensor&, Tensor&, F32&, F32&);                \
  template void Interpreter<A>::norm_backward(const std::string&, const Tensor&, const F32&, const F32&, Tensor&);   \
  template void Interpreter<A>::residual_forward(const Tensor&, Tensor&, const A*, int, k::DropoutSite);             \
  template void Interpreter<A>::residual_backward(Tensor&, Tensor&, float*, int, k::DropoutSite);                    \
  template k::AttentionDropout* Interpreter<A>::attention_dropout(k::AttentionDropout&, int);                        \
  template void Interpreter<A>::forward_op(const Instr&, ChunkState<A>&, Tensor&, bool);                             \
  template void Interpreter<A>::linear_backward(const Instr&, LayerState<A>*, ChunkState<A>&, Tensor&, std::int64_t, \
                                                std::int64_t, const A*, float*, float*, const Tensor&);              \
  template void Interpreter<A>::backward_op(const Instr&, ChunkState<A>&, Tensor&);                                  \
  template void Interpreter<A>::recompute_op(const Instr&, ChunkState<A>&);                                          \
  template void Interpreter<A>::free_recomputed(LayerState<A>&);                                                     \
  template void Interpreter<A>::body_collective(const Instr&, ChunkState<A>&, Tensor&, Tensor&);                     \
  template const Instr* Interpreter<A>::next_compute() const;                                                        \
  template const Interpreter<A>::Tensor& Interpreter<A>::saved_input_for(const Instr&, ChunkState<A>&);
DTRAIN_INSTANTIATE_LAYER_OPS(float)
DTRAIN_INSTANTIATE_LAYER_OPS(bf16)
#undef DTRAIN_INSTANTIATE_LAYER_OPS

}  // namespace dtrain::exec::detail
