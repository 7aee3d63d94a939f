#include "dtrain/ir/lower.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "dtrain/common/error.h"
#include "dtrain/model/layer_graph.h"
#include "dtrain/plan/placement.h"

namespace dtrain::ir {

namespace {

using plan::ParallelConfig;
using plan::Schedule;

enum class Kind { kF, kB, kBI, kBW };
struct Action {
  Kind kind;
  int chunk;
  int mb;
};

// Zero-bubble H1 (Qi et al. 2024): the backward split into input gradients (BI, on the critical path) and weight
// gradients (W, free to move). The order of every stage comes from a list schedule on unit costs (F = BI = W = 1,
// free communication), as the paper derives it: a stage runs the next BI when its gradient has arrived, else the
// next F when fewer than P - s micro-batches hold activations (1F1B's memory: activations are freed by W), else a
// pending W. The W's fill the drain that 1F1B leaves idle.
std::vector<Action> zero_bubble_h1(int P, int M, int stage) {
  struct St {
    int nf = 0, nbi = 0, nw = 0;
    int busy_until = 0;
    std::vector<Action> order;
  };
  std::vector<St> st(static_cast<std::size_t>(P));
  std::vector<std::vector<int>> f_done(static_cast<std::size_t>(P), std::vector<int>(static_cast<std::size_t>(M), -1));
  std::vector<std::vector<int>> bi_done = f_done;
  auto done = [](int t_done, int t) { return t_done >= 0 && t_done <= t; };
  int finished = 0;
  for (int t = 0; finished < P; ++t) {
    for (int s = 0; s < P; ++s) {
      St& x = st[static_cast<std::size_t>(s)];
      if (x.busy_until > t || x.nw == M) continue;
      auto su = static_cast<std::size_t>(s);
      if (x.nbi < x.nf && done(f_done[su][static_cast<std::size_t>(x.nbi)], t) &&
          (s == P - 1 || done(bi_done[su + 1][static_cast<std::size_t>(x.nbi)], t))) {
        bi_done[su][static_cast<std::size_t>(x.nbi)] = t + 1;
        x.order.push_back({Kind::kBI, stage, x.nbi++});
      } else if (x.nf < M && x.nf - x.nw < P - s &&
                 (s == 0 || done(f_done[su - 1][static_cast<std::size_t>(x.nf)], t))) {
        f_done[su][static_cast<std::size_t>(x.nf)] = t + 1;
        x.order.push_back({Kind::kF, stage, x.nf++});
      } else if (x.nw < x.nbi) {
        x.order.push_back({Kind::kBW, stage, x.nw++});
        if (x.nw == M) ++finished;
      } else {
        continue;
      }
      x.busy_until = t + 1;
    }
  }
  // The chunk of stage s is s (zb-h1 has one chunk per stage).
  return st[static_cast<std::size_t>(stage)].order;
}

// The order of compute passes on pipeline stage `stage`, in steps: the point-to-point transfers between two steps
// form one group. 1F1B-like schedules make every pass its own step (Megatron's send_forward_recv_backward after a
// forward, send_backward_recv_forward after a backward). The interleaved schedule's steady state runs a forward and
// a backward back to back and then exchanges all four tensors in one group, as Megatron-LM's
// send_forward_backward_recv_forward_backward does; lowering it pass by pass deadlocks (the verifier finds the
// cycle), because a stage would then send a gradient its neighbour only receives after its own next exchange.
std::vector<std::vector<Action>> compute_steps(const ParallelConfig& c, int stage) {
  const int P = c.pp, V = c.vpp, M = c.num_microbatches;
  std::vector<Action> out;
  auto chunk_of = [&](int v) { return v * P + stage; };
  switch (c.schedule) {
    case Schedule::kGpipe:
      for (int j = 0; j < M; ++j) {
        for (int v = 0; v < V; ++v) out.push_back({Kind::kF, chunk_of(v), j});
      }
      for (int j = 0; j < M; ++j) {
        for (int v = V - 1; v >= 0; --v) out.push_back({Kind::kB, chunk_of(v), j});
      }
      break;
    case Schedule::k1F1B:
    case Schedule::kZbH1: {
      int warm = std::min(P - stage - 1, M);
      for (int j = 0; j < warm; ++j) out.push_back({Kind::kF, chunk_of(0), j});
      for (int i = 0; i < M - warm; ++i) {
        out.push_back({Kind::kF, chunk_of(0), warm + i});
        out.push_back({Kind::kB, chunk_of(0), i});
      }
      for (int i = M - warm; i < M; ++i) out.push_back({Kind::kB, chunk_of(0), i});
      break;
    }
    case Schedule::kInterleaved: {
      // Megatron-LM's interleaved 1F1B (schedules.py): forward pass k runs model chunk (k % (P*V)) / P on
      // micro-batch (k / (P*V)) * P + k % P; backward pass k the chunks in reverse order.
      const int total = M * V;
      int warm = M == P ? total : std::min((P - stage - 1) * 2 + (V - 1) * P, total);
      auto mb_of = [&](int k) { return (k / (P * V)) * P + k % P; };
      auto fwd = [&](int k) { return Action{Kind::kF, chunk_of((k % (P * V)) / P), mb_of(k)}; };
      auto bwd = [&](int k) { return Action{Kind::kB, chunk_of(V - 1 - (k % (P * V)) / P), mb_of(k)}; };
      std::vector<std::vector<Action>> steps;
      steps.reserve(static_cast<std::size_t>(total) + static_cast<std::size_t>(warm));
      for (int k = 0; k < warm; ++k) steps.push_back({fwd(k)});
      for (int k = 0; k < total - warm; ++k) steps.push_back({fwd(warm + k), bwd(k)});
      for (int k = total - warm; k < total; ++k) steps.push_back({bwd(k)});
      return steps;
    }
  }
  if (c.schedule == Schedule::kZbH1) out = zero_bubble_h1(P, M, stage);
  std::vector<std::vector<Action>> steps;
  steps.reserve(out.size());
  for (const Action& a : out) steps.push_back({a});
  return steps;
}

// Builds the bodies (tensor-parallel partitioned op lists) of one chunk.
class BodyBuilder {
 public:
  BodyBuilder(const model::ModelDescription& model, const ParallelConfig& config)
      : m_(model.model),
        graph_(model::build_layer_graph(model.model, model.training)),
        c_(config),
        dtype_(model.training.dtype) {
    tokens_ = static_cast<std::int64_t>(c_.micro_batch) * m_.seq_len / c_.cp;  // this rank's chunks
    hidden_count_ = tokens_ * m_.hidden;
    kv_count_ = tokens_ * c_.cp * 2 * (m_.kv_heads / c_.tp) * m_.head_dim();
  }

  std::shared_ptr<const Body> build(const ChunkInfo& chunk, BodyKind kind) const {
    auto body = std::make_shared<Body>();
    body->chunk = chunk.index;
    body->kind = kind;
    std::vector<Instr>& out = body->instrs;
    if (kind == BodyKind::kForward) {
      if (chunk.embedding) embedding_forward(out);
      for (int l = chunk.first_layer; l < chunk.first_layer + chunk.layers; ++l) layer_forward(out, l, Pass::kForward);
      if (chunk.head) head_forward(out);
      return body;
    }
    if (kind == BodyKind::kBackwardWeight) {
      if (chunk.head) weight_grads(out, graph_.head, static_cast<int>(m_.layers));
      for (int l = chunk.first_layer + chunk.layers - 1; l >= chunk.first_layer; --l)
        weight_grads(out, graph_.layer_ops(l), l);
      return body;
    }
    Pass pass = kind == BodyKind::kBackward ? Pass::kBackward : Pass::kBackwardInput;
    if (chunk.head) head_backward(out, pass);
    for (int l = chunk.first_layer + chunk.layers - 1; l >= chunk.first_layer; --l) layer_backward(out, l, pass);
    if (chunk.embedding) embedding_backward(out, pass);
    return body;
  }

 private:
  Instr compute(BodyOp body_op, int layer, Pass pass, int index = -1) const {
    Instr in;
    in.op = Opcode::kCompute;
    in.body_op = body_op;
    in.layer = layer;
    in.pass = pass;
    in.index = index;
    return in;
  }

  // The body op of a layer graph op, by its name (the layer graph and BodyOp list the same ops).
  static BodyOp body_op_of(const model::Op& op) {
    auto body_op = parse_body_op(op.name);
    if (!body_op) throw internal_error(fmt::format("layer graph op '{}' has no BodyOp", op.name));
    return *body_op;
  }

  Instr tp_collective(Opcode op, What what, int layer, int index, std::int64_t count, ReduceOp reduce) const {
    Instr in;
    in.op = op;
    in.on = CommGroup::kTp;
    in.what = what;
    in.layer = layer;
    in.index = index;
    in.count = count;
    in.dtype = what == What::kHidden ? dtype_ : DType::kFp32;
    in.reduce = reduce;
    return in;
  }

  bool tp() const { return c_.tp > 1; }
  bool sp() const { return c_.sequence_parallel && c_.tp > 1; }
  bool cp() const { return c_.cp > 1; }

  // Context parallelism: the whole sequences' keys and values gathered over the cp ranks before an attention reads
  // them (kKv), or their gradients reduce-scattered back to their chunks' ranks after its backward (kKvGrad); with
  // cp_comm=p2p the ring that passes one rank's block at a time instead (RING, the count one block); with
  // cp_comm=a2a the all-to-all of the heads before the attention (kHeads), whose backward sends the gradients back.
  void kv_exchange(std::vector<Instr>& out, int layer, int& index, Pass pass, bool gradients = false) const {
    const bool ring = c_.cp_comm == plan::CpComm::kP2p, heads = c_.cp_comm == plan::CpComm::kA2a;
    if (heads && gradients) return;  // the attention's backward sends the gradients back itself
    Instr in;
    in.op = heads ? Opcode::kAllToAll : ring ? Opcode::kRing : gradients ? Opcode::kReduceScatter : Opcode::kAllGather;
    in.on = CommGroup::kCp;
    in.what = heads ? What::kHeads : gradients ? What::kKvGrad : What::kKv;
    in.layer = layer;
    in.index = index++;
    // a2a: what each member sends each, this rank's rows of one head group's queries, keys and values.
    in.count = heads  ? tokens_ * ((m_.heads + 2 * m_.kv_heads) / c_.tp / c_.cp) * m_.head_dim()
               : ring ? kv_count_ / c_.cp
                      : kv_count_;
    in.dtype = dtype_;
    in.reduce = gradients && !ring ? ReduceOp::kSum : ReduceOp::kNone;
    in.pass = pass;
    out.push_back(in);
  }

  // Gather the sequence-split input of a column-parallel layer (sequence parallelism); `what` kSavedInput for the
  // saved input re-gathered for a weight gradient.
  void gather(std::vector<Instr>& out, int layer, int& index, What what = What::kHidden) const {
    out.push_back(tp_collective(Opcode::kAllGather, what, layer, index++, hidden_count_, ReduceOp::kNone));
  }
  // Sum the partial outputs of a row-parallel layer (or partial input gradients of a column-parallel one).
  void reduce(std::vector<Instr>& out, int layer, int& index) const {
    if (sp()) {
      out.push_back(
          tp_collective(Opcode::kReduceScatter, What::kHidden, layer, index++, hidden_count_, ReduceOp::kSum));
    } else {
      out.push_back(tp_collective(Opcode::kAllReduce, What::kHidden, layer, index++, hidden_count_, ReduceOp::kSum));
    }
  }

  // The vocab-parallel lookup's partial rows are summed over the group before learned positions are added (adding
  // them before the sum would count them tp times).
  void embedding_forward(std::vector<Instr>& out) const {
    int index = 0;
    out.push_back(compute(BodyOp::kEmbedTokens, -1, Pass::kForward));
    if (tp()) reduce(out, -1, index);
    if (m_.position == model::PositionKind::kLearned) {
      out.push_back(compute(BodyOp::kEmbedPositions, -1, Pass::kForward));
    }
  }

  void embedding_backward(std::vector<Instr>& out, Pass pass) const {
    int index = 200;
    if (m_.position == model::PositionKind::kLearned) out.push_back(compute(BodyOp::kEmbedPositions, -1, pass));
    if (sp()) gather(out, -1, index);  // the forward's reduce-scatter becomes an all-gather of the gradient
    out.push_back(compute(BodyOp::kEmbedTokens, -1, pass));
  }

  void layer_forward(std::vector<Instr>& out, int layer, Pass pass) const {
    int index = pass == Pass::kRecompute ? 100 : 0;  // recomputed collectives keep distinct keys
    for (const model::Op& op : graph_.layer_ops(layer)) {
      if (op.is_moe()) {
        if (op.moe == model::MoePart::kRouter) moe_forward(out, layer, pass, index);
        continue;
      }
      if (op.split == model::TpSplit::kColumn && sp()) gather(out, layer, index);
      if (op.kind == model::OpKind::kAttention && cp()) kv_exchange(out, layer, index, pass);
      out.push_back(compute(body_op_of(op), layer, pass));
      if (op.split == model::TpSplit::kRow && tp()) reduce(out, layer, index);
    }
  }

  // An MoE layer's MLP (layer_graph.cc's moe ops): the router sees every token of the micro-batch (gathered with
  // SP); the experts' and shared experts' outputs are partial sums over tp, reduced once after the combine. With
  // etp = 1 (moe_local) each tensor-parallel rank runs it on its own sequence shard with whole experts: no
  // tensor-parallel collective at all.
  void moe_forward(std::vector<Instr>& out, int layer, Pass pass, int& index) const {
    if (sp() && !moe_local()) gather(out, layer, index);
    out.push_back(compute(BodyOp::kMoeRoute, layer, pass));
    if (cp() && m_.moe.aux_loss_coeff > 0) {
      // The load-balancing loss is per sequence: its statistics summed over the ranks holding the chunks.
      Instr in;
      in.op = Opcode::kAllReduce;
      in.on = CommGroup::kCp;
      in.what = What::kRouterStats;
      in.layer = layer;
      in.index = index++;
      in.count = std::int64_t{c_.micro_batch} * m_.moe.experts * 2;
      in.dtype = DType::kFp32;
      in.reduce = ReduceOp::kSum;
      in.pass = pass;
      out.push_back(in);
    }
    if (ep()) {
      out.push_back(expert_exchange(What::kExpertCounts, layer, index++));
      out.push_back(expert_exchange(What::kExpertTokens, layer, index++));  // dispatch
    }
    out.push_back(compute(BodyOp::kMoeExperts, layer, pass));
    if (ep()) out.push_back(expert_exchange(What::kExpertTokens, layer, index++));  // combine
    if (m_.moe.shared_ffn_hidden > 0) out.push_back(compute(BodyOp::kMoeShared, layer, pass));
    out.push_back(compute(BodyOp::kMoeCombine, layer, pass));
    if (tp() && !moe_local()) reduce(out, layer, index);
  }

  bool ep() const { return c_.ep > 1; }
  bool moe_local() const { return plan::CostModel::moe_token_parallel(c_); }
  // The tokens an MoE layer's MLP sees on this rank.
  std::int64_t moe_tokens() const { return moe_local() ? tokens_ / c_.tp : tokens_; }

  // An all-to-all over the expert-parallel group: the rows' counts (one int32 per local expert of the receiver), or
  // rows of hidden values, the balanced expectation per peer (the micro-batch's routed rows spread evenly).
  // (Before the experts' op the rows go to their experts' ranks; after it they come back.)
  Instr expert_exchange(What what, int layer, int index) const {
    Instr in;
    in.op = Opcode::kAllToAll;
    in.on = CommGroup::kEp;
    in.what = what;
    in.layer = layer;
    in.index = index;
    if (what == What::kExpertCounts) {
      in.count = m_.moe.experts / c_.ep;
      in.dtype = DType::kInt32;
    } else {
      in.count = moe_tokens() * m_.moe.top_k * m_.hidden / c_.ep;
      in.dtype = dtype_;
    }
    return in;
  }

  // Its backward, weight gradients included (a zero-bubble BWD_W has nothing left of an MoE layer's MLP): the
  // gates' gradients are summed over tp before the router's backward reads them.
  void moe_backward(std::vector<Instr>& out, int layer, Pass pass, int& index) const {
    if (sp() && !moe_local()) gather(out, layer, index);
    out.push_back(compute(BodyOp::kMoeCombine, layer, pass));
    if (tp() && !moe_local()) {
      std::int64_t count = tokens_ * m_.moe.top_k + (m_.moe.shared_gate ? tokens_ : 0);
      out.push_back(tp_collective(Opcode::kAllReduce, What::kRouterGrad, layer, index++, count, ReduceOp::kSum));
    }
    if (m_.moe.shared_ffn_hidden > 0) out.push_back(compute(BodyOp::kMoeShared, layer, pass));
    // The output rows' gradients go to the experts' ranks (the combine's way back), the input rows' gradients back.
    if (ep()) out.push_back(expert_exchange(What::kExpertTokens, layer, index++));
    out.push_back(compute(BodyOp::kMoeExperts, layer, pass));
    if (ep()) out.push_back(expert_exchange(What::kExpertTokens, layer, index++));
    out.push_back(compute(BodyOp::kMoeRoute, layer, pass));
    if (tp() && !moe_local()) reduce(out, layer, index);
  }

  void layer_backward(std::vector<Instr>& out, int layer, Pass pass) const {
    if (c_.recompute == plan::Recompute::kFull) layer_forward(out, layer, Pass::kRecompute);
    int index = 200;
    const auto& ops = graph_.layer_ops(layer);
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      const model::Op& op = *it;
      if (op.is_moe()) {
        if (op.moe == model::MoePart::kRouter) moe_backward(out, layer, pass, index);
        continue;
      }
      // The attention's keys and values: gathered for its recomputation (which keeps them for the backward), or for
      // the backward itself; a full recomputation gathered them already.
      const bool attention = op.kind == model::OpKind::kAttention;
      if (attention && cp() && c_.recompute != plan::Recompute::kFull) kv_exchange(out, layer, index, pass);
      if (c_.recompute == plan::Recompute::kSelective && attention) {
        out.push_back(compute(body_op_of(op), layer, Pass::kRecompute));
      }
      // Row-parallel: the forward reduce-scatter's gradient is an all-gather (SP); an all-reduce's is the identity.
      if (op.split == model::TpSplit::kRow && sp()) gather(out, layer, index);
      // Column-parallel with SP: gather the saved input shard again for the weight gradient (unless zero-bubble
      // defers the weight gradient to BWD_W, which gathers it there).
      if (op.split == model::TpSplit::kColumn && sp() && pass == Pass::kBackward) {
        gather(out, layer, index, What::kSavedInput);
      }
      out.push_back(compute(body_op_of(op), layer, pass));
      if (attention && cp()) kv_exchange(out, layer, index, pass, true);
      if (op.split == model::TpSplit::kColumn && tp()) reduce(out, layer, index);  // partial input gradients
    }
  }

  void head_forward(std::vector<Instr>& out) const {
    const int L = static_cast<int>(m_.layers);
    int index = 0;
    out.push_back(compute(BodyOp::kHeadNorm, L, Pass::kForward));
    if (sp()) gather(out, L, index);
    out.push_back(compute(BodyOp::kHeadLogits, L, Pass::kForward));
    if (!tp()) {
      out.push_back(compute(BodyOp::kHeadCrossEntropy, L, Pass::kForward));
      return;
    }
    // Megatron's vocab-parallel cross entropy: max, then sum of exponentials and the target logit.
    out.push_back(compute(BodyOp::kHeadCrossEntropy, L, Pass::kForward, 0));
    out.push_back(tp_collective(Opcode::kAllReduce, What::kLogitsMax, L, index++, tokens_, ReduceOp::kMax));
    out.push_back(compute(BodyOp::kHeadCrossEntropy, L, Pass::kForward, 1));
    out.push_back(tp_collective(Opcode::kAllReduce, What::kLogitsSumExp, L, index++, tokens_, ReduceOp::kSum));
    out.push_back(tp_collective(Opcode::kAllReduce, What::kTargetLogit, L, index++, tokens_, ReduceOp::kSum));
    out.push_back(compute(BodyOp::kHeadCrossEntropy, L, Pass::kForward, 2));
  }

  void head_backward(std::vector<Instr>& out, Pass pass) const {
    const int L = static_cast<int>(m_.layers);
    int index = 200;
    out.push_back(compute(BodyOp::kHeadCrossEntropy, L, pass));
    if (sp() && pass == Pass::kBackward) gather(out, L, index, What::kSavedInput);
    out.push_back(compute(BodyOp::kHeadLogits, L, pass));
    if (tp()) reduce(out, L, index);
    out.push_back(compute(BodyOp::kHeadNorm, L, pass));
  }

  void weight_grads(std::vector<Instr>& out, const std::vector<model::Op>& ops, int layer) const {
    int index = 300;
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      if (it->kind != model::OpKind::kLinear || it->params == 0 || it->is_moe()) continue;
      if (it->split != model::TpSplit::kRow && sp()) gather(out, layer, index, What::kSavedInput);
      out.push_back(compute(body_op_of(*it), layer, Pass::kBackwardWeight));
    }
  }

  const model::ModelSpec& m_;
  model::LayerGraph graph_;
  const ParallelConfig& c_;
  DType dtype_;
  std::int64_t tokens_ = 0;
  std::int64_t hidden_count_ = 0;
  std::int64_t kv_count_ = 0;  // context parallelism: the whole sequences' keys and values on this rank's heads
};

struct Bucket {
  int lo = 0, hi = 0;  // extended layer range [lo, hi): -1 embedding, L head
  std::int64_t params = 0;
  std::int64_t expert_params = 0;  // of those, routed experts' (reduced over the edp group when ep > 1)
};

class Lowering {
 public:
  explicit Lowering(const plan::Plan& plan)
      : plan_(plan), c_(plan.config), cost_(plan.model, plan.cluster), bodies_(plan.model, plan.config) {
    const auto& m = plan.model.model;
    if (auto problem = cost_.structural_problem(c_, plan.inputs.global_batch)) {
      throw input_error(fmt::format("plan {} cannot be lowered: {}", plan.digest, *problem));
    }
    if (auto problem = plan::execution_problem(plan.model.model, c_)) {
      throw input_error(fmt::format("plan {} cannot be lowered: {}", plan.digest, problem->message));
    }
    int first = 0;
    for (int ch = 0; ch < c_.chunks(); ++ch) {
      chunk_first_.push_back(first);
      first += c_.chunk_layers[static_cast<std::size_t>(ch)];
    }
    if (first != m.layers) throw input_error("plan: chunk_layers do not add up to the model's layers");
    tokens_ = static_cast<std::int64_t>(c_.micro_batch) * m.seq_len / c_.cp;
    p2p_count_ = tokens_ * m.hidden / (c_.sequence_parallel && c_.tp > 1 ? c_.tp : 1);
    act_dtype_ = plan.model.training.dtype;
    grad_dtype_ = plan.model.training.grad_reduce_fp32 ? DType::kFp32 : act_dtype_;
    tied_across_stages_ = m.tied_embeddings && c_.pp > 1;
    tied_apart_ = model::tied_matrix_apart(m, c_.pp, c_.fsdp, c_.dp_cp());
  }

  Program lower_rank(int rank, std::map<int, std::vector<std::shared_ptr<const Body>>>* body_cache) const {
    const auto& m = plan_.model.model;
    if (rank < 0 || rank >= c_.world_size()) {
      throw input_error(fmt::format("rank {} is outside the plan's world of {}", rank, c_.world_size()));
    }
    plan::RankPlacement pl = plan::place_rank(c_, std::max(1, plan_.inputs.gpus_per_node), {}, 0, rank);
    Program p;
    p.rank = rank;
    p.world = c_.world_size();
    p.plan_digest = plan_.digest;
    p.model_digest = plan_.model.digest;
    p.tp = c_.tp;
    p.pp = c_.pp;
    p.dp = c_.dp;
    p.vpp = c_.vpp;
    p.tp_rank = pl.tp_rank;
    p.pp_rank = pl.pp_rank;
    p.dp_rank = pl.dp_rank;
    p.cp = c_.cp;
    p.cp_rank = pl.cp_rank;
    p.micro_batch = c_.micro_batch;
    p.num_microbatches = c_.num_microbatches;
    p.layers = static_cast<std::int32_t>(m.layers);
    p.schedule_name = std::string(plan::to_string(c_.schedule));
    p.sequence_parallel = c_.sequence_parallel;
    p.distributed_optimizer = c_.distributed_optimizer;
    p.fsdp = c_.fsdp;
    p.tp_group = plan::tp_group_ranks(c_, rank);
    p.pp_group = plan::pp_group_ranks(c_, rank);
    p.dp_group = plan::dp_group_ranks(c_, rank);
    if (c_.cp > 1) p.cp_group = plan::cp_group_ranks(c_, rank);
    p.etp = plan::CostModel::moe_token_parallel(c_) ? 1 : 0;
    if (c_.ep > 1) {
      // Expert groups: ep consecutive data-parallel(-with-cp) ranks; the ranks holding the same experts, every ep-th
      // one.
      p.ep = c_.ep;
      const int q = p.dp_cp_rank();
      p.ep_rank = q % c_.ep;
      const int first = q - p.ep_rank;
      for (int d = first; d < first + c_.ep; ++d) p.ep_group.push_back(p.dp_group[static_cast<std::size_t>(d)]);
      for (int d = p.ep_rank; d < c_.dp_cp(); d += c_.ep) {
        p.edp_group.push_back(p.dp_group[static_cast<std::size_t>(d)]);
      }
    }
    if (tied_across_stages_ && (pl.pp_rank == 0 || pl.pp_rank == c_.pp - 1)) {
      p.embedding_group = {plan::rank_of(c_, pl.tp_rank, 0, pl.dp_rank, pl.cp_rank),
                           plan::rank_of(c_, pl.tp_rank, c_.pp - 1, pl.dp_rank, pl.cp_rank)};
    }
    const int s = pl.pp_rank;
    for (int v = 0; v < c_.vpp; ++v) p.chunks.push_back(chunk_info(v * c_.pp + s));

    const std::vector<std::shared_ptr<const Body>>* shared = nullptr;
    if (body_cache != nullptr) {
      auto it = body_cache->find(s);
      if (it != body_cache->end()) shared = &it->second;
    }
    if (shared != nullptr) {
      p.bodies = *shared;
    } else {
      for (const auto& ch : p.chunks) {
        p.bodies.push_back(bodies_.build(ch, BodyKind::kForward));
        if (c_.schedule == Schedule::kZbH1) {
          p.bodies.push_back(bodies_.build(ch, BodyKind::kBackwardInput));
          p.bodies.push_back(bodies_.build(ch, BodyKind::kBackwardWeight));
        } else {
          p.bodies.push_back(bodies_.build(ch, BodyKind::kBackward));
        }
      }
      if (c_.fsdp && c_.dp_cp() > 1) {
        for (auto& b : p.bodies) b = with_fsdp(*b, *p.chunk_info(b->chunk));
      }
      if (body_cache) (*body_cache)[s] = p.bodies;
    }
    p.schedule = schedule(p, pl);
    return p;
  }

 private:
  ChunkInfo chunk_info(int ch) const {
    ChunkInfo info;
    info.index = ch;
    info.first_layer = chunk_first_[static_cast<std::size_t>(ch)];
    info.layers = c_.chunk_layers[static_cast<std::size_t>(ch)];
    info.embedding = ch == 0;
    info.head = ch == c_.chunks() - 1;
    return info;
  }

  int holder(const plan::RankPlacement& pl, int ch) const {
    return plan::rank_of(c_, pl.tp_rank, ch % c_.pp, pl.dp_rank, pl.cp_rank);
  }

  // A chunk's units (-1 the embedding, a layer, `layers` the head) in backward order (head first), with their
  // parameters on this rank. With tied embeddings across stages, the tied matrix is left out: it is reduced at the
  // end of the step, after the first and last stage have summed their copies.
  struct Unit {
    int layer;
    std::int64_t params;
    std::int64_t expert_params = 0;
  };
  std::vector<Unit> units(const ChunkInfo& ch) const {
    const auto& m = plan_.model.model;
    const int L = static_cast<int>(m.layers);
    std::vector<Unit> units;
    auto params_of = [&](int layers, bool emb, bool head) {
      return static_cast<std::int64_t>(std::llround(cost_.stage_params(c_, 0, layers, emb, head)));
    };
    std::int64_t vocab_shard = model::vocab_shard_rows(m, c_.tp) * m.hidden;
    if (ch.head) {
      std::int64_t head = params_of(0, false, true);
      if (tied_across_stages_) head -= vocab_shard;
      units.push_back({L, head});
    }
    for (int l = ch.first_layer + ch.layers - 1; l >= ch.first_layer; --l) {
      units.push_back({l, static_cast<std::int64_t>(std::llround(cost_.layer_params(c_, l))),
                       static_cast<std::int64_t>(std::llround(cost_.expert_layer_params(c_, l)))});
    }
    if (ch.embedding) {
      std::int64_t emb = params_of(0, true, false);
      if (tied_apart_) emb -= vocab_shard;
      units.push_back({-1, emb});
    }
    return units;
  }

  // Gradient buckets of a chunk in backward order (head first), each at most CostModel::kBucketBytes of gradients.
  std::vector<Bucket> buckets(const ChunkInfo& ch) const {
    const double grad_bytes = grad_dtype_ == DType::kFp32 ? 4.0 : 2.0;
    const auto limit = static_cast<std::int64_t>(plan::CostModel::kBucketBytes / grad_bytes);
    std::vector<Bucket> out;
    for (const Unit& u : units(ch)) {
      if (out.empty() || out.back().params + u.params > limit) out.push_back({u.layer, u.layer + 1, 0});
      out.back().lo = u.layer;
      out.back().params += u.params;
      out.back().expert_params += u.expert_params;
    }
    return out;
  }

  // Fully sharded (fsdp): a unit's parameters all-gathered (what=layer_params), or its gradients reduce-scattered
  // (grad_bucket), over dp; with ep > 1 the routed experts' over edp, as dp_reductions splits a bucket.
  void unit_collectives(std::vector<Instr>& out, int chunk, const Unit& u, Opcode op) const {
    Instr in;
    in.op = op;
    in.on = CommGroup::kDp;
    in.what = op == Opcode::kAllGather ? What::kLayerParams : What::kGradBucket;
    in.chunk = chunk;
    in.layer = u.layer;
    in.layer_end = u.layer + 1;
    in.dtype = op == Opcode::kAllGather ? act_dtype_ : grad_dtype_;
    in.reduce = op == Opcode::kAllGather ? ReduceOp::kNone : ReduceOp::kSum;
    const bool split = c_.ep > 1 && u.expert_params > 0;
    in.count = split ? u.params - u.expert_params : u.params;
    if (in.count > 0) out.push_back(in);
    if (split && c_.dp_cp() / c_.ep > 1) {
      in.on = CommGroup::kEdp;
      if (op == Opcode::kReduceScatter) in.what = What::kExpertGradBucket;
      in.count = u.expert_params;
      out.push_back(in);
    }
  }

  // A body with fsdp's collectives: before the first unit's ops the gathers of the first two units, before each
  // further unit's ops the gather of the unit after it (one unit of prefetch), and in a backward after each unit's
  // ops the reduce-scatter of its gradients.
  std::shared_ptr<const Body> with_fsdp(const Body& body, const ChunkInfo& ch) const {
    std::map<int, Unit> by_layer;
    for (const Unit& u : units(ch)) by_layer.emplace(u.layer, u);
    std::vector<int> order;  // units in the order the body runs them
    for (const Instr& in : body.instrs) {
      if (!order.empty() && order.back() == in.layer) continue;
      if (std::find(order.begin(), order.end(), in.layer) != order.end() || by_layer.count(in.layer) == 0) {
        throw internal_error(
            fmt::format("fsdp: the {} body of chunk {} returns to unit {} or runs one not of the chunk",
                        to_string(body.kind), body.chunk, in.layer));
      }
      order.push_back(in.layer);
    }
    auto out = std::make_shared<Body>();
    out->chunk = body.chunk;
    out->kind = body.kind;
    const bool backward = body.kind != BodyKind::kForward;
    auto gather = [&](std::size_t k) {
      if (k < order.size()) unit_collectives(out->instrs, ch.index, by_layer.at(order[k]), Opcode::kAllGather);
    };
    gather(0);
    gather(1);
    std::size_t k = 0;
    for (std::size_t i = 0; i < body.instrs.size(); ++i) {
      if (i > 0 && body.instrs[i].layer != body.instrs[i - 1].layer) {
        if (backward) unit_collectives(out->instrs, ch.index, by_layer.at(order[k]), Opcode::kReduceScatter);
        ++k;
        gather(k + 1);
      }
      out->instrs.push_back(body.instrs[i]);
    }
    if (backward && !order.empty()) {
      unit_collectives(out->instrs, ch.index, by_layer.at(order.back()), Opcode::kReduceScatter);
    }
    return out;
  }

  // The data-parallel reduction of the gradients of layers [b.lo, b.hi) of a chunk (-1 the embedding, `layers` the
  // head), or of the tied word embeddings (what=embedding_grad) when `tied`.
  // Parameters of units [lo, hi) replicated over the tensor-parallel group: norms, row-parallel biases, learned
  // positions.
  std::int64_t replicated_params(const Bucket& b) const {
    const auto& m = plan_.model.model;
    const int L = static_cast<int>(m.layers);
    std::int64_t norm = m.norm == model::NormKind::kLayerNorm ? 2 * m.hidden : m.hidden;
    std::int64_t layer = 2 * norm + (m.linear_bias ? 2 * m.hidden : 0);
    // An MoE layer's router (and shared experts' gate) is replicated too; with etp = 1 so are its experts (this
    // rank's) and shared experts, whole on every tensor-parallel rank.
    std::int64_t moe_layer = 2 * norm + m.moe.experts * m.hidden + (m.moe.shared_gate ? m.hidden : 0);
    if (plan::CostModel::moe_token_parallel(c_)) {
      moe_layer += m.moe.experts / c_.ep * m.mlp_params(m.moe.ffn_hidden, false) +
                   m.mlp_params(m.moe.shared_ffn_hidden, false);  // 0 without shared experts
    }
    std::int64_t n = 0;
    for (int u = b.lo; u < b.hi; ++u) {
      if (u == -1)
        n += m.position == model::PositionKind::kLearned ? m.seq_len * m.hidden : 0;
      else if (u == L)
        n += norm;
      else
        n += m.is_moe_layer(u) ? moe_layer : layer;
    }
    return n;
  }

  // With sequence parallelism the gradients of replicated parameters are partial sums over sequence shards: sum
  // them over the tensor-parallel group (Megatron's all-reduce of layernorm gradients) once they are final.
  void replicated_reduction(std::vector<Instr>& out, int chunk, const Bucket& b) const {
    if (!(c_.sequence_parallel && c_.tp > 1)) return;
    std::int64_t n = replicated_params(b);
    if (n == 0) return;
    Instr in;
    in.op = Opcode::kAllReduce;
    in.on = CommGroup::kTp;
    in.what = What::kReplicatedGrads;
    in.chunk = chunk;
    in.layer = b.lo;
    in.layer_end = b.hi;
    in.count = n;
    in.dtype = grad_dtype_;
    in.reduce = ReduceOp::kSum;
    out.push_back(in);
  }

  // A bucket's reduction: over dp, or with ep > 1 its routed experts' gradients over edp (the data-parallel ranks
  // that hold the same experts) and the rest over dp.
  void dp_reductions(std::vector<Instr>& out, int chunk, int index, const Bucket& b) const {
    if (c_.ep <= 1 || b.expert_params == 0) {
      out.push_back(dp_reduction(chunk, index, b));
      return;
    }
    Bucket dense = b;
    dense.params -= b.expert_params;
    if (dense.params > 0) out.push_back(dp_reduction(chunk, index, dense));
    if (c_.dp_cp() / c_.ep > 1) {
      Instr in = dp_reduction(chunk, index, b);
      in.on = CommGroup::kEdp;
      in.what = What::kExpertGradBucket;
      in.count = b.expert_params;
      out.push_back(in);
    }
  }

  Instr dp_reduction(int chunk, int index, const Bucket& b, bool tied = false) const {
    Instr in;
    in.op = c_.distributed_optimizer ? Opcode::kReduceScatter : Opcode::kAllReduce;
    in.on = CommGroup::kDp;
    in.what = tied ? What::kEmbeddingGrad : What::kGradBucket;
    in.chunk = chunk;
    in.index = index;
    if (!tied) {
      in.layer = b.lo;
      in.layer_end = b.hi;
    }
    in.count = b.params;
    in.dtype = grad_dtype_;
    in.reduce = ReduceOp::kSum;
    return in;
  }

  std::vector<Instr> schedule(const Program& p, const plan::RankPlacement& pl) const {
    const int C = c_.chunks();
    const int M = c_.num_microbatches;
    const bool zb = c_.schedule == Schedule::kZbH1;
    std::vector<Instr> out;
    std::vector<Instr> pending;  // point-to-point instructions waiting to be flushed as one group
    int next_group = 0;
    auto flush = [&]() {
      if (pending.size() > 1) {
        for (auto& in : pending) in.group = next_group;
        ++next_group;
      }
      for (auto& in : pending) out.push_back(in);
      pending.clear();
    };
    auto p2p = [&](Opcode op, What what, int chunk, int mb, int peer) {
      Instr in;
      in.op = op;
      in.what = what;
      in.chunk = chunk;
      in.mb = mb;
      in.peer = peer;
      in.count = p2p_count_;
      in.dtype = act_dtype_;
      pending.push_back(in);
    };
    struct DeferredBucket {
      int chunk;
      Bucket bucket;
    };
    std::vector<DeferredBucket> deferred;  // without overlap: reduced after the last backward
    int bucket_index = 0;
    std::vector<std::pair<int, Bucket>> all_buckets;  // for the distributed optimizer's all-gathers

    std::vector<Instr> posts;  // sends of the current step, flushed with the next step's receives
    for (const auto& step : compute_steps(c_, pl.pp_rank)) {
      std::vector<Instr> loads;
      for (const Action& a : step) {
        if (a.kind == Kind::kF) {
          if (a.chunk > 0) p2p(Opcode::kRecv, What::kActivation, a.chunk - 1, a.mb, holder(pl, a.chunk - 1));
          if (a.chunk == 0 || a.chunk == C - 1) {
            Instr load;
            load.op = Opcode::kLoad;
            load.mb = a.mb;
            load.what = C == 1 ? What::kBatch : a.chunk == 0 ? What::kTokens : What::kTargets;
            loads.push_back(load);
          }
        } else if (a.kind == Kind::kB || a.kind == Kind::kBI) {
          if (a.chunk < C - 1) p2p(Opcode::kRecv, What::kGradient, a.chunk + 1, a.mb, holder(pl, a.chunk + 1));
        }
      }
      pending.insert(pending.begin(), posts.begin(), posts.end());
      posts.clear();
      flush();
      for (const auto& load : loads) out.push_back(load);

      for (const Action& a : step) {
        Instr compute;
        compute.chunk = a.chunk;
        compute.mb = a.mb;
        compute.op = a.kind == Kind::kF    ? Opcode::kForward
                     : a.kind == Kind::kB  ? Opcode::kBackward
                     : a.kind == Kind::kBI ? Opcode::kBackwardInput
                                           : Opcode::kBackwardWeight;
        bool completes_grads = (a.kind == Kind::kB || a.kind == Kind::kBW) && a.mb == M - 1;
        bool sp_grads = c_.sequence_parallel && c_.tp > 1;
        if (completes_grads && c_.dp_cp() > 1 && !c_.fsdp) {
          const ChunkInfo* info = p.chunk_info(a.chunk);
          std::vector<Bucket> bs = buckets(*info);
          for (const Bucket& b : bs) all_buckets.emplace_back(a.chunk, b);
          if (plan_.model.training.overlap_grad_reduce && bs.size() > 1) {
            // Cut the last micro-batch's backward at bucket boundaries; each bucket is reduced right after its piece.
            for (const Bucket& b : bs) {
              Instr piece = compute;
              piece.layer = b.lo;
              piece.layer_end = b.hi;
              out.push_back(piece);
              replicated_reduction(out, a.chunk, b);
              dp_reductions(out, a.chunk, bucket_index++, b);
            }
          } else {
            out.push_back(compute);
            for (const Bucket& b : bs) {
              if (plan_.model.training.overlap_grad_reduce) {
                replicated_reduction(out, a.chunk, b);
                dp_reductions(out, a.chunk, bucket_index++, b);
              } else {
                deferred.push_back({a.chunk, b});
              }
            }
          }
        } else if (completes_grads && sp_grads) {
          out.push_back(compute);
          const ChunkInfo* info = p.chunk_info(a.chunk);
          int L = static_cast<int>(plan_.model.model.layers);
          Bucket all{info->embedding ? -1 : info->first_layer, info->head ? L + 1 : info->first_layer + info->layers,
                     0};
          replicated_reduction(out, a.chunk, all);
        } else {
          out.push_back(compute);
        }
        if (a.kind == Kind::kF && a.chunk < C - 1) {
          p2p(Opcode::kSend, What::kActivation, a.chunk, a.mb, holder(pl, a.chunk + 1));
        } else if ((a.kind == Kind::kB || a.kind == Kind::kBI) && a.chunk > 0) {
          p2p(Opcode::kSend, What::kGradient, a.chunk, a.mb, holder(pl, a.chunk - 1));
        }
        posts.insert(posts.end(), pending.begin(), pending.end());
        pending.clear();
      }
    }
    pending = posts;
    flush();

    for (const auto& d : deferred) {
      replicated_reduction(out, d.chunk, d.bucket);
      dp_reductions(out, d.chunk, bucket_index++, d.bucket);
    }

    const auto& m = plan_.model.model;
    const std::int64_t tied_count = model::vocab_shard_rows(m, c_.tp) * m.hidden;  // the tied matrix, where apart
    if (!p.embedding_group.empty()) {
      // First and last stage sum the gradients of their copies of the word embeddings, then reduce that matrix over
      // data parallelism.
      Instr in;
      in.op = Opcode::kAllReduce;
      in.on = CommGroup::kEmbedding;
      in.what = What::kEmbeddingGrad;
      in.count = tied_count;
      in.dtype = grad_dtype_;
      in.reduce = ReduceOp::kSum;
      out.push_back(in);
    }
    if (tied_apart_ && (pl.pp_rank == 0 || pl.pp_rank == c_.pp - 1) && c_.dp_cp() > 1) {
      // The tied matrix, a bucket of its own (with fsdp the only one the schedule reduces and gathers).
      int chunk = pl.pp_rank == 0 ? 0 : C - 1;
      Bucket tied{0, 0, tied_count};
      out.push_back(dp_reduction(chunk, bucket_index++, tied, true));
      all_buckets.emplace_back(chunk, Bucket{-2, -2, tied_count});  // -2: the tied matrix
    }
    if (p.world > 1) {
      Instr norm;
      norm.op = Opcode::kAllReduce;
      norm.on = CommGroup::kWorld;
      norm.what = What::kGradNorm;
      norm.count = 1;
      norm.dtype = DType::kFp32;
      norm.reduce = ReduceOp::kSum;
      out.push_back(norm);
      Instr loss = norm;
      loss.what = What::kLoss;
      out.push_back(loss);
    }
    Instr optim;
    optim.op = Opcode::kOptimizerStep;
    out.push_back(optim);
    if (c_.distributed_optimizer && c_.dp_cp() > 1) {
      // The updated shards back to every replica: like the gradients, a bucket's routed experts over edp (ep > 1),
      // the rest over dp. (With fsdp the tied matrix alone: the units are gathered by the passes.)
      int index = 0;
      for (const auto& [chunk, b] : all_buckets) {
        Instr in;
        in.op = Opcode::kAllGather;
        in.on = CommGroup::kDp;
        in.what = b.lo == -2 ? What::kEmbeddingParams : What::kParamBucket;
        in.chunk = chunk;
        in.index = index++;
        if (b.lo != -2) {
          in.layer = b.lo;
          in.layer_end = b.hi;
        }
        in.count = b.params;
        in.dtype = act_dtype_;
        const bool split = c_.ep > 1 && b.expert_params > 0;
        if (split) in.count -= b.expert_params;
        if (in.count > 0) out.push_back(in);
        if (split && c_.dp_cp() / c_.ep > 1) {
          in.on = CommGroup::kEdp;
          in.count = b.expert_params;
          out.push_back(in);
        }
      }
    }
    Instr ckpt;
    ckpt.op = Opcode::kCheckpoint;
    out.push_back(ckpt);
    (void)zb;
    return out;
  }

  const plan::Plan& plan_;
  const ParallelConfig& c_;
  plan::CostModel cost_;
  BodyBuilder bodies_;
  std::vector<int> chunk_first_;
  std::int64_t tokens_ = 0;
  std::int64_t p2p_count_ = 0;
  DType act_dtype_ = DType::kFp32;
  DType grad_dtype_ = DType::kFp32;
  bool tied_across_stages_ = false;
  bool tied_apart_ = false;  // model::tied_matrix_apart: the tied matrix outside the units (pp > 1, or fsdp)
};

}  // namespace

Program lower(const plan::Plan& plan, int rank) { return Lowering(plan).lower_rank(rank, nullptr); }

std::vector<Program> lower_all(const plan::Plan& plan) {
  Lowering lowering(plan);
  std::map<int, std::vector<std::shared_ptr<const Body>>> cache;
  std::vector<Program> out;
  out.reserve(static_cast<std::size_t>(plan.config.world_size()));
  for (int r = 0; r < plan.config.world_size(); ++r) out.push_back(lowering.lower_rank(r, &cache));
  return out;
}

plan::Plan plan_for_layout(const model::ModelDescription& model, const topology::ClusterSpec& cluster,
                           const plan::ParallelConfig& config, std::int64_t global_batch) {
  topology::ClusterSpec c = cluster;
  c.nodes = std::max(1, (config.world_size() + c.node.gpus - 1) / c.node.gpus);
  plan::CostModel cm(model, c);
  if (auto problem = cm.structural_problem(config, global_batch)) {
    throw input_error(fmt::format("layout {}: {}", config.summary(), *problem));
  }
  plan::Estimate e = cm.evaluate(config, global_batch);
  return plan::make_plan(e, cm, {});
}

}  // namespace dtrain::ir
