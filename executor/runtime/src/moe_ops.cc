// An MoE layer's MLP in the interpreter (interpreter.h): the stage-body ops moe.route, moe.experts, moe.shared and
// moe.combine, forward and backward. The body's current tensor enters moe.route as every token of the micro-batch
// (gathered with sequence parallelism) and leaves moe.combine as the experts' weighted outputs, partial sums over
// tensor parallelism (the experts' matrices are split as a dense MLP's), which the body's reduction sums. With
// etp = 1 (Program::moe_token_parallel) it enters as this rank's sequence shard, whole sequences, and leaves as
// their whole outputs: the experts are whole on every tensor-parallel rank, and no tensor-parallel collective runs.
// Tm is the number of tokens the MLP sees.
//
// Routing is decided on the host: the top-k choices come back from the backend (Tm * top_k integers), and the
// permutation (each expert's rows in token order), the capacity drops and the load-balancing loss are computed here,
// so that every backend and layout routes alike. The tensor-parallel ranks route identically: same input, same
// kernel.
#include <fmt/format.h>

#include "interpreter.h"

namespace dtrain::exec::detail {

namespace k = dtrain::kernels;
using ir::BodyOp;
using ir::Instr;

namespace {

std::string expert_weight(int layer, std::int64_t e, const char* name) {
  return fmt::format("layers.{}.moe.experts.{}.{}.weight", layer, e, name);
}

bool backward_pass(const Instr& in) { return in.pass == ir::Pass::kBackward || in.pass == ir::Pass::kBackwardInput; }

}  // namespace

template <typename A>
void Interpreter<A>::activation_forward(std::int64_t rows, std::int64_t width, const Tensor& a, Tensor& g) {
  sized(g, static_cast<std::size_t>(rows * width), kUninitialized);
  if (m.activation == model::ActivationKind::kSwiGlu)
    kern.swiglu_forward(rows, width, a.data(), g.data());
  else
    kern.gelu_forward(rows * width, a.data(), g.data());
}

// dy: the activation output's gradient in, the input's out.
template <typename A>
void Interpreter<A>::activation_backward(std::int64_t rows, std::int64_t width, const Tensor& a, Tensor& dy) {
  Tensor dx(be, a.size(), kUninitialized);
  if (m.activation == model::ActivationKind::kSwiGlu)
    kern.swiglu_backward(rows, width, a.data(), dy.data(), dx.data());
  else
    kern.gelu_backward(rows * width, a.data(), dy.data(), dx.data());
  dy.swap(dx);
}

template <typename A>
void Interpreter<A>::moe_route_forward(const Instr& in, MoeState<A>& ms, const Tensor& x) {
  const model::MoeSpec& moe = m.moe;
  // A sequence's rows on this rank: all of it, or with context parallelism its two chunks.
  const std::int64_t E = moe.experts, K = moe.top_k, S = m.seq_len / prog.cp;
  const std::int64_t sequences = Tm / S;
  Tensor logits(be, static_cast<std::size_t>(Tm * E));
  kern.linear_forward({Tm, h, E}, x.data(), W(L(in.layer, "moe.router.weight")), nullptr, logits.data());
  sized(ms.probs, static_cast<std::size_t>(Tm * E));
  sized(ms.expert, static_cast<std::size_t>(Tm * K));
  sized(ms.gate, static_cast<std::size_t>(Tm * K));
  kern.moe_route({Tm, E, K, moe.normalize_top_k}, logits.data(), ms.probs.data(), ms.expert.data(), ms.gate.data());

  // The permutation: each expert's rows in token order; with a capacity, a sequence's earliest assignments first.
  std::vector<std::int32_t> expert(static_cast<std::size_t>(Tm * K));
  be.copy_to_host(expert.data(), ms.expert.data(), expert.size() * sizeof(std::int32_t));
  std::vector<std::int64_t> count(static_cast<std::size_t>(sequences * E), 0);  // choices per (sequence, expert)
  std::vector<char> kept(expert.size(), 1);
  const std::int64_t capacity = moe.capacity_factor > 0 ? moe.capacity(S) : Tm * K;
  for (std::int64_t t = 0; t < Tm; ++t) {
    for (std::int64_t j = 0; j < K; ++j) {
      const auto a = static_cast<std::size_t>(t * K + j);
      std::int64_t& n = count[static_cast<std::size_t>((t / S) * E + expert[a])];
      kept[a] = n < capacity ? 1 : 0;
      ++n;
    }
  }
  ms.offsets.assign(static_cast<std::size_t>(E + 1), 0);
  for (std::size_t a = 0; a < expert.size(); ++a) {
    if (kept[a]) ++ms.offsets[static_cast<std::size_t>(expert[a]) + 1];
  }
  for (std::int64_t e = 0; e < E; ++e)
    ms.offsets[static_cast<std::size_t>(e + 1)] += ms.offsets[static_cast<std::size_t>(e)];
  std::vector<std::int64_t> next(ms.offsets.begin(), ms.offsets.end() - 1);
  std::vector<std::int32_t> rows(static_cast<std::size_t>(ms.offsets.back())), slot(expert.size(), -1);
  for (std::int64_t t = 0; t < Tm; ++t) {
    for (std::int64_t j = 0; j < K; ++j) {
      const auto a = static_cast<std::size_t>(t * K + j);
      if (!kept[a]) continue;
      const std::int64_t row = next[static_cast<std::size_t>(expert[a])]++;
      rows[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(t);
      slot[a] = static_cast<std::int32_t>(row);
    }
  }
  ms.rows = upload(rows);
  ms.slot = upload(slot);

  // The load-balancing loss per sequence (moe.h's formula, on the choices before any drop): with context
  // parallelism once its statistics were summed over the cp ranks (ALLREDUCE what=router_stats, moe_router_stats).
  ms.aux_grad.clear();
  ms.aux_stats.clear();
  if (moe.aux_loss_coeff > 0) {
    std::vector<float> probs(static_cast<std::size_t>(Tm * E));
    be.copy_to_host(probs.data(), ms.probs.data(), probs.size() * sizeof(float));
    std::vector<double> chosen(static_cast<std::size_t>(sequences * E)), prob(chosen.size());
    for (std::int64_t s = 0; s < sequences; ++s) {
      for (std::int64_t e = 0; e < E; ++e) {
        double p = 0;
        for (std::int64_t t = s * S; t < (s + 1) * S; ++t) p += probs[static_cast<std::size_t>(t * E + e)];
        const auto i = static_cast<std::size_t>(s * E + e);
        chosen[i] = static_cast<double>(count[i]);
        prob[i] = p;
      }
    }
    if (prog.cp == 1) {
      moe_aux_loss(in, ms, chosen, prob);
    } else {
      ms.aux_stats.assign(chosen.begin(), chosen.end());  // fp32: counts below 2^24 are exact
      ms.aux_stats.insert(ms.aux_stats.end(), prob.begin(), prob.end());
    }
  }
  sized(ms.xe, static_cast<std::size_t>(ms.offsets.back() * h));
  kern.moe_gather_rows(ms.offsets.back(), h, x.data(), ms.rows.data(), ms.xe.data());
}

// The load-balancing loss of the micro-batch's sequences from their choices and router probability sums per
// (sequence, expert), and its gradient on the probabilities, scaled as the loss is: a mean over the batch's sequences.
template <typename A>
void Interpreter<A>::moe_aux_loss(const Instr& in, MoeState<A>& ms, const std::vector<double>& chosen,
                                  const std::vector<double>& prob) {
  const model::MoeSpec& moe = m.moe;
  const std::int64_t E = moe.experts, K = moe.top_k, S = m.seq_len;
  const double scale = moe.aux_loss_coeff * static_cast<double>(E) /
                       (static_cast<double>(K) * static_cast<double>(S) * static_cast<double>(S)) /
                       static_cast<double>(opt.global_batch);
  std::vector<float> grad(chosen.size());
  double loss = 0;
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    loss += scale * chosen[i] * prob[i];
    grad[i] = static_cast<float>(scale * chosen[i]);
  }
  ms.aux_grad = upload(grad);
  // Once per micro-batch (not again when recomputed), by one rank of the tensor-parallel group (with etp = 1 by
  // each: its own sequences) and of the context-parallel group. A validation pass reports the language-model loss
  // alone.
  if (in.pass != ir::Pass::kRecompute && !step_.eval && (prog.tp_rank == 0 || prog.moe_token_parallel()) &&
      prog.cp_rank == 0) {
    step_.loss_sum += loss;
  }
}

// ALLREDUCE on=cp what=router_stats: the statistics of the sequences' chunks summed over the cp ranks, then the loss.
template <typename A>
void Interpreter<A>::moe_router_stats(const Instr& in, ChunkState<A>& st) {
  MoeState<A>& ms = layer_state(st, in.layer).moe;
  std::vector<float>& stats = ms.aux_stats;
  check_count(in, static_cast<std::int64_t>(stats.size()));
  if (!be.host_accessible()) {
    throw input_error(fmt::format("{}: the {} backend does not run context parallelism", ir::to_text(in), be.name()));
  }
  communicate(*comms.cp, [&] { comms.cp->all_reduce(stats.data(), stats.data(), stats.size(), comm::ReduceOp::kSum); });
  const auto half = static_cast<std::ptrdiff_t>(stats.size() / 2);
  moe_aux_loss(in, ms, std::vector<double>(stats.begin(), stats.begin() + half),
               std::vector<double>(stats.begin() + half, stats.end()));
  stats.clear();
}

// This rank's experts as groups of rows: the rows of each local expert (from its offsets) and the pointers to its
// weights and gradients.
template <typename A>
typename Interpreter<A>::ExpertGroups Interpreter<A>::expert_groups(const std::vector<std::int64_t>& offsets,
                                                                    int layer) {
  ExpertGroups g;
  const std::int64_t local = m.moe.experts / prog.ep, base = prog.ep_rank * local;
  for (std::int64_t j = 0; j < local; ++j) {
    g.rows.push_back(offsets[static_cast<std::size_t>(j + 1)] - offsets[static_cast<std::size_t>(j)]);
    g.fc1.push_back(W(expert_weight(layer, base + j, "fc1")));
    g.fc2.push_back(W(expert_weight(layer, base + j, "fc2")));
    g.dfc1.push_back(G(expert_weight(layer, base + j, "fc1")));
    g.dfc2.push_back(G(expert_weight(layer, base + j, "fc2")));
  }
  g.total = offsets.back();
  return g;
}

// The experts run on this rank's experts' rows: the permuted rows (every expert here), or with expert parallelism the
// local rows the dispatch brought (experts [ep_rank * local, (ep_rank + 1) * local)). Each of fc1 and fc2 is one
// grouped GEMM over the experts (Kernels::grouped_linear_*).
template <typename A>
void Interpreter<A>::moe_experts_forward(MoeState<A>& ms, int layer) {
  const bool ep = prog.ep > 1;
  const Tensor& x = ep ? ms.lx : ms.xe;
  Tensor& y = ep ? ms.ly : ms.ye;
  const ExpertGroups g = expert_groups(ep ? ms.local_offsets : ms.offsets, layer);
  const std::int64_t N = g.total, fw = expert_width(), fc = expert_fc1_cols();
  sized(ms.ae, static_cast<std::size_t>(N * fc));
  sized(y, static_cast<std::size_t>(N * h));
  const auto n = static_cast<std::int64_t>(g.rows.size());
  gemm.grouped_forward(n, g.rows.data(), h, fc, x.data(), g.fc1.data(), ms.ae.data());
  activation_forward(N, fw, ms.ae, ms.ge);
  gemm.grouped_forward(n, g.rows.data(), fw, h, ms.ge.data(), g.fc2.data(), y.data());
}

template <typename A>
void Interpreter<A>::moe_shared_forward(MoeState<A>& ms, int layer) {
  const std::int64_t fw = m.moe.shared_ffn_hidden / moe_split(), fc = m.fc1_columns(fw);
  sized(ms.sa, static_cast<std::size_t>(Tm * fc));
  gemm.forward({Tm, h, fc}, ms.x.data(), W(L(layer, "moe.shared.fc1.weight")), nullptr, ms.sa.data());
  activation_forward(Tm, fw, ms.sa, ms.sg);
  sized(ms.sy, static_cast<std::size_t>(Tm * h));
  gemm.forward({Tm, fw, h}, ms.sg.data(), W(L(layer, "moe.shared.fc2.weight")), nullptr, ms.sy.data());
  if (m.moe.shared_gate) {
    Tensor z(be, static_cast<std::size_t>(Tm));
    kern.linear_forward({Tm, h, 1}, ms.x.data(), W(L(layer, "moe.shared.gate.weight")), nullptr, z.data());
    sized(ms.shared_gate, static_cast<std::size_t>(Tm));
    kern.moe_sigmoid_gate(Tm, z.data(), ms.shared_gate.data());
  }
}

template <typename A>
void Interpreter<A>::moe_forward(const Instr& in, ChunkState<A>& st, Tensor& cur) {
  MoeState<A>& ms = layer_state(st, in.layer).moe;
  switch (in.body_op) {
    case BodyOp::kMoeRoute:
      ms.x = cur;
      moe_route_forward(in, ms, ms.x);
      return;
    case BodyOp::kMoeExperts:
      moe_experts_forward(ms, in.layer);
      return;
    case BodyOp::kMoeShared:
      moe_shared_forward(ms, in.layer);
      return;
    case BodyOp::kMoeCombine:
      sized(cur, static_cast<std::size_t>(Tm * h));
      kern.moe_unpermute(Tm, m.moe.top_k, h, ms.ye.data(), ms.slot.data(), ms.gate.data(), false, cur.data());
      if (m.moe.shared_gate) {  // cur += gate[t] * sy[t]
        kern.moe_unpermute(Tm, 1, h, ms.sy.data(), token_rows.data(), ms.shared_gate.data(), true, cur.data());
      } else if (!ms.sy.empty()) {
        kern.residual_add(Tm * h, cur.data(), ms.sy.data(), cur.data());
      }
      return;
    default:
      throw internal_error(fmt::format("not an MoE op: {}", ir::to_text(in)));
  }
}

template <typename A>
void Interpreter<A>::moe_experts_backward(MoeState<A>& ms, int layer) {
  const bool ep = prog.ep > 1;
  const Tensor& x = ep ? ms.lx : ms.xe;
  const Tensor& dy = ep ? ms.ldy : ms.dye;
  Tensor& dx = ep ? ms.ldx : ms.dxe;
  const ExpertGroups g = expert_groups(ep ? ms.local_offsets : ms.offsets, layer);
  const std::int64_t N = g.total, fw = expert_width(), fc = expert_fc1_cols();
  const auto n = static_cast<std::int64_t>(g.rows.size());
  Tensor dg(be, static_cast<std::size_t>(N * fw));
  gemm.grouped_backward_weight(n, g.rows.data(), fw, h, dy.data(), ms.ge.data(), g.dfc2.data());
  gemm.grouped_backward_input(n, g.rows.data(), fw, h, dy.data(), g.fc2.data(), dg.data());
  activation_backward(N, fw, ms.ae, dg);  // dg: now the fc1 output's gradient [N, fc]
  sized(dx, static_cast<std::size_t>(N * h));
  gemm.grouped_backward_weight(n, g.rows.data(), h, fc, dg.data(), x.data(), g.dfc1.data());
  gemm.grouped_backward_input(n, g.rows.data(), h, fc, dg.data(), g.fc1.data(), dx.data());
}

// The all-to-alls of expert parallelism (moe_state.h). Counts first (once per forward, recomputation included):
// each member learns how many rows every other member sends each of its experts. Rows then go to the experts' ranks
// before the experts' op (the input rows in the forward, the output rows' gradients in the backward) and come back
// after it (the output rows, the input rows' gradients), regrouped between "by sender" and "by local expert".
template <typename A>
void Interpreter<A>::moe_exchange(const Instr& in, ChunkState<A>& st) {
  MoeState<A>& ms = layer_state(st, in.layer).moe;
  comm::Communicator& c = *comms.ep;
  const int P = prog.ep;
  const std::int64_t local = m.moe.experts / P;
  const comm::Tag tag = comm::message_tag(
      fmt::format("moe {} layer {} index {} mb {}", ir::to_string(in.what), in.layer, in.index, step_.mb));
  const auto at = [](const std::vector<std::int64_t>& v, std::int64_t i) { return v[static_cast<std::size_t>(i)]; };
  if (in.what == ir::What::kExpertCounts) {
    check_count(in, local);
    std::vector<std::int32_t> sent(static_cast<std::size_t>(m.moe.experts)), got(sent.size());
    for (std::int64_t e = 0; e < m.moe.experts; ++e) {
      sent[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(at(ms.offsets, e + 1) - at(ms.offsets, e));
    }
    Buffer<std::int32_t> sb = upload(sent), rb(be, got.size());
    const std::vector<std::size_t> counts(static_cast<std::size_t>(P), static_cast<std::size_t>(local));
    communicate(c, [&] { c.all_to_all(sb.data(), counts, rb.data(), counts, DType::kInt32, tag); });
    be.copy_to_host(got.data(), rb.data(), got.size() * sizeof(std::int32_t));
    ms.recv_counts.assign(got.begin(), got.end());
    ms.send_rows.assign(static_cast<std::size_t>(P), 0);
    ms.recv_rows.assign(static_cast<std::size_t>(P), 0);
    ms.local_offsets.assign(static_cast<std::size_t>(local + 1), 0);
    for (int q = 0; q < P; ++q) {
      ms.send_rows[static_cast<std::size_t>(q)] = at(ms.offsets, (q + 1) * local) - at(ms.offsets, q * local);
      for (std::int64_t j = 0; j < local; ++j) {
        const std::int64_t n = at(ms.recv_counts, q * local + j);
        ms.recv_rows[static_cast<std::size_t>(q)] += n;
        ms.local_offsets[static_cast<std::size_t>(j + 1)] += n;
      }
    }
    for (std::int64_t j = 0; j < local; ++j) {
      ms.local_offsets[static_cast<std::size_t>(j + 1)] += at(ms.local_offsets, j);
    }
    return;
  }
  // Which way: before the experts' op the rows go to them; the pass of the op after says forward or backward.
  const Instr* next = next_compute();
  if (next == nullptr) throw internal_error(fmt::format("an expert all-to-all ends its body: {}", ir::to_text(in)));
  const bool to_experts = next->body_op == BodyOp::kMoeExperts;
  const bool backward = backward_pass(*next);
  // Row blocks (p, j): by sender at sender_start, by local expert at local_start.
  std::vector<std::int64_t> sender_start(static_cast<std::size_t>(P * local)), local_start(sender_start.size());
  for (std::int64_t p = 0, r = 0; p < P; ++p) {
    for (std::int64_t j = 0; j < local; ++j) {
      sender_start[static_cast<std::size_t>(p * local + j)] = r;
      r += at(ms.recv_counts, p * local + j);
    }
  }
  for (std::int64_t j = 0; j < local; ++j) {
    for (std::int64_t p = 0, r = at(ms.local_offsets, j); p < P; ++p) {
      local_start[static_cast<std::size_t>(p * local + j)] = r;
      r += at(ms.recv_counts, p * local + j);
    }
  }
  const std::int64_t received = ms.local_offsets.back();
  auto regroup = [&](const Tensor& from, Tensor& to, bool to_local) {
    for (std::int64_t b = 0; b < P * local; ++b) {
      const std::int64_t n = at(ms.recv_counts, b);
      if (n == 0) continue;
      const std::int64_t from_row = to_local ? at(sender_start, b) : at(local_start, b);
      const std::int64_t to_row = to_local ? at(local_start, b) : at(sender_start, b);
      be.copy(to.data() + to_row * h, from.data() + from_row * h, static_cast<std::size_t>(n * h) * sizeof(A));
    }
  };
  auto elements = [&](const std::vector<std::int64_t>& rows) {
    std::vector<std::size_t> out(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) out[i] = static_cast<std::size_t>(rows[i] * h);
    return out;
  };
  Tensor by_sender(be, static_cast<std::size_t>(received * h));
  if (to_experts) {
    const Tensor& src = backward ? ms.dye : ms.xe;
    Tensor& dst = backward ? ms.ldy : ms.lx;
    communicate(c, [&] {
      c.all_to_all(src.data(), elements(ms.send_rows), by_sender.data(), elements(ms.recv_rows), kAct, tag);
    });
    dst = Tensor(be, static_cast<std::size_t>(received * h));
    regroup(by_sender, dst, true);
    return;
  }
  const Tensor& src = backward ? ms.ldx : ms.ly;
  Tensor& dst = backward ? ms.dxe : ms.ye;
  regroup(src, by_sender, false);
  dst = Tensor(be, static_cast<std::size_t>(ms.offsets.back() * h));
  communicate(c, [&] {
    c.all_to_all(by_sender.data(), elements(ms.recv_rows), dst.data(), elements(ms.send_rows), kAct, tag);
  });
}

template <typename A>
void Interpreter<A>::moe_shared_backward(MoeState<A>& ms, int layer) {
  const std::int64_t fw = m.moe.shared_ffn_hidden / moe_split(), fc = m.fc1_columns(fw);
  Tensor dg(be, static_cast<std::size_t>(Tm * fw));
  gemm.backward_weight({Tm, fw, h}, ms.dout.data(), ms.sg.data(), G(L(layer, "moe.shared.fc2.weight")), nullptr);
  gemm.backward_input({Tm, fw, h}, ms.dout.data(), W(L(layer, "moe.shared.fc2.weight")), dg.data());
  activation_backward(Tm, fw, ms.sa, dg);
  gemm.backward_weight({Tm, h, fc}, dg.data(), ms.x.data(), G(L(layer, "moe.shared.fc1.weight")), nullptr);
  sized(ms.dx, static_cast<std::size_t>(Tm * h));
  gemm.backward_input({Tm, h, fc}, dg.data(), W(L(layer, "moe.shared.fc1.weight")), ms.dx.data());
  ms.dout.clear();
}

// The router's backward, and the input gradient: the experts' rows summed back per token, the shared experts', and
// (once over the tensor-parallel group, whose body reduction sums the partial gradients) the router's.
template <typename A>
void Interpreter<A>::moe_route_backward(MoeState<A>& ms, Tensor& cur, int layer) {
  const model::MoeSpec& moe = m.moe;
  const std::int64_t E = moe.experts, K = moe.top_k;
  Tensor dlogits(be, static_cast<std::size_t>(Tm * E));
  kern.moe_route_backward({Tm, E, K, moe.normalize_top_k}, ms.probs.data(), ms.expert.data(), ms.dgate.data(),
                          ms.aux_grad.empty() ? nullptr : ms.aux_grad.data(), m.seq_len / prog.cp, dlogits.data());
  sized(cur, static_cast<std::size_t>(Tm * h));
  if (!ms.dx.empty()) {
    be.copy(cur.data(), ms.dx.data(), cur.size() * sizeof(A));
    kern.moe_unpermute(Tm, K, h, ms.dxe.data(), ms.slot.data(), nullptr, true, cur.data());
  } else {
    kern.moe_unpermute(Tm, K, h, ms.dxe.data(), ms.slot.data(), nullptr, false, cur.data());
  }
  // A linear layer hidden -> n replicated over tensor parallelism (the router; the shared experts' gate): its weight
  // gradient over every token, or with sequence parallelism over this rank's sequence shard (the replicated
  // gradients' all-reduce sums the shards); its input gradient added once over the group. With etp = 1 the layer
  // saw only this rank's shard: both over all of it.
  const bool own_tokens = prog.moe_token_parallel();
  const std::int64_t r0 = sp && !own_tokens ? prog.tp_rank * Tl : 0, rows = sp ? Tl : Tm;
  auto replicated_backward = [&](const Tensor& dout, std::int64_t n, const std::string& weight) {
    kern.linear_backward_weight({rows, h, n}, dout.data() + r0 * n, ms.x.data() + r0 * h, G(weight), nullptr);
    if (prog.tp_rank != 0 && !own_tokens) return;
    Tensor dx(be, static_cast<std::size_t>(Tm * h));
    kern.linear_backward_input({Tm, h, n}, dout.data(), W(weight), dx.data());
    kern.residual_add(Tm * h, cur.data(), dx.data(), cur.data());
  };
  replicated_backward(dlogits, E, L(layer, "moe.router.weight"));
  if (moe.shared_gate) {  // a sigmoid of a linear layer hidden -> 1
    Tensor dz(be, static_cast<std::size_t>(Tm));
    kern.moe_sigmoid_gate_backward(Tm, ms.shared_gate.data(), ms.dgate.data() + Tm * K, dz.data());
    replicated_backward(dz, 1, L(layer, "moe.shared.gate.weight"));
  }
}

template <typename A>
void Interpreter<A>::moe_backward(const Instr& in, ChunkState<A>& st, Tensor& cur) {
  if (!backward_pass(in)) throw internal_error(fmt::format("an MoE op in a weight-gradient pass: {}", ir::to_text(in)));
  MoeState<A>& ms = layer_state(st, in.layer).moe;
  switch (in.body_op) {
    case BodyOp::kMoeCombine: {
      const std::int64_t K = m.moe.top_k;
      sized(ms.dye, static_cast<std::size_t>(ms.offsets.back() * h));
      sized(ms.dgate, static_cast<std::size_t>(Tm * K + (m.moe.shared_gate ? Tm : 0)));
      kern.moe_unpermute_backward(Tm, K, h, cur.data(), ms.ye.data(), ms.slot.data(), ms.gate.data(), ms.dye.data(),
                                  ms.dgate.data());
      if (m.moe.shared_gate) {  // the shared output's gradient is gate * dout; the gate's, dot(dout, sy)
        sized(ms.dout, static_cast<std::size_t>(Tm * h));
        kern.moe_unpermute_backward(Tm, 1, h, cur.data(), ms.sy.data(), token_rows.data(), ms.shared_gate.data(),
                                    ms.dout.data(), ms.dgate.data() + Tm * K);
      } else if (m.moe.shared_ffn_hidden > 0) {
        ms.dout = cur;
      }
      return;
    }
    case BodyOp::kMoeShared:
      moe_shared_backward(ms, in.layer);
      return;
    case BodyOp::kMoeExperts:
      moe_experts_backward(ms, in.layer);
      return;
    case BodyOp::kMoeRoute:
      moe_route_backward(ms, cur, in.layer);
      return;
    default:
      throw internal_error(fmt::format("not an MoE op: {}", ir::to_text(in)));
  }
}

// This file's members for both activation types (interpreter.h).
#define DTRAIN_INSTANTIATE_MOE_OPS(A)                                                                         \
  template void Interpreter<A>::activation_forward(std::int64_t, std::int64_t, const Tensor&, Tensor&);       \
  template void Interpreter<A>::activation_backward(std::int64_t, std::int64_t, const Tensor&, Tensor&);      \
  template void Interpreter<A>::moe_route_forward(const Instr&, MoeState<A>&, const Tensor&);                 \
  template void Interpreter<A>::moe_aux_loss(const Instr&, MoeState<A>&, const std::vector<double>&,          \
                                             const std::vector<double>&);                                     \
  template void Interpreter<A>::moe_router_stats(const Instr&, ChunkState<A>&);                               \
  template void Interpreter<A>::moe_route_backward(MoeState<A>&, Tensor&, int);                               \
  template Interpreter<A>::ExpertGroups Interpreter<A>::expert_groups(const std::vector<std::int64_t>&, int); \
  template void Interpreter<A>::moe_experts_forward(MoeState<A>&, int);                                       \
  template void Interpreter<A>::moe_experts_backward(MoeState<A>&, int);                                      \
  template void Interpreter<A>::moe_shared_forward(MoeState<A>&, int);                                        \
  template void Interpreter<A>::moe_shared_backward(MoeState<A>&, int);                                       \
  template void Interpreter<A>::moe_exchange(const Instr&, ChunkState<A>&);                                   \
  template void Interpreter<A>::moe_forward(const Instr&, ChunkState<A>&, Tensor&);                           \
  template void Interpreter<A>::moe_backward(const Instr&, ChunkState<A>&, Tensor&);
DTRAIN_INSTANTIATE_MOE_OPS(float)
DTRAIN_INSTANTIATE_MOE_OPS(bf16)
#undef DTRAIN_INSTANTIATE_MOE_OPS

}  // namespace dtrain::exec::detail
