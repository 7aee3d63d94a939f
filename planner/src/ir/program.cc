#include "dtrain/ir/program.h"

#include <fmt/format.h>

#include <numeric>

namespace dtrain::ir {

std::string_view to_string(Opcode op) {
  switch (op) {
    case Opcode::kLoad:
      return "LOAD";
    case Opcode::kForward:
      return "FWD";
    case Opcode::kBackward:
      return "BWD";
    case Opcode::kBackwardInput:
      return "BWD_I";
    case Opcode::kBackwardWeight:
      return "BWD_W";
    case Opcode::kSend:
      return "SEND";
    case Opcode::kRecv:
      return "RECV";
    case Opcode::kAllReduce:
      return "ALLREDUCE";
    case Opcode::kAllGather:
      return "ALLGATHER";
    case Opcode::kReduceScatter:
      return "REDUCESCATTER";
    case Opcode::kOptimizerStep:
      return "OPTIM";
    case Opcode::kCheckpoint:
      return "CKPT";
    case Opcode::kAllToAll:
      return "ALLTOALL";
    case Opcode::kRing:
      return "RING";
    case Opcode::kCompute:
      return "COMPUTE";
  }
  return "?";
}

std::optional<Opcode> parse_opcode(std::string_view t) {
  for (int i = 0; i <= static_cast<int>(Opcode::kRing); ++i) {
    auto op = static_cast<Opcode>(i);
    if (to_string(op) == t) return op;
  }
  return std::nullopt;
}

std::string_view to_string(CommGroup g) {
  switch (g) {
    case CommGroup::kNone:
      return "none";
    case CommGroup::kTp:
      return "tp";
    case CommGroup::kPp:
      return "pp";
    case CommGroup::kDp:
      return "dp";
    case CommGroup::kWorld:
      return "world";
    case CommGroup::kEmbedding:
      return "embedding";
    case CommGroup::kEp:
      return "ep";
    case CommGroup::kEdp:
      return "edp";
    case CommGroup::kCp:
      return "cp";
  }
  return "?";
}

std::string_view to_string(What w) {
  switch (w) {
    case What::kNone:
      return "none";
    case What::kTokens:
      return "tokens";
    case What::kTargets:
      return "targets";
    case What::kBatch:
      return "batch";
    case What::kActivation:
      return "act";
    case What::kGradient:
      return "grad";
    case What::kHidden:
      return "hidden";
    case What::kLogitsMax:
      return "logits_max";
    case What::kLogitsSumExp:
      return "logits_sumexp";
    case What::kTargetLogit:
      return "target_logit";
    case What::kGradBucket:
      return "grad_bucket";
    case What::kParamBucket:
      return "param_bucket";
    case What::kEmbeddingGrad:
      return "embedding_grad";
    case What::kGradNorm:
      return "grad_norm";
    case What::kLoss:
      return "loss";
    case What::kEmbeddingParams:
      return "embedding_params";
    case What::kSavedInput:
      return "saved_input";
    case What::kReplicatedGrads:
      return "replicated_grads";
    case What::kRouterGrad:
      return "router_grad";
    case What::kExpertCounts:
      return "expert_counts";
    case What::kExpertTokens:
      return "expert_tokens";
    case What::kExpertGradBucket:
      return "expert_grad_bucket";
    case What::kLayerParams:
      return "layer_params";
    case What::kKv:
      return "kv";
    case What::kKvGrad:
      return "kv_grad";
    case What::kRouterStats:
      return "router_stats";
    case What::kHeads:
      return "heads";
  }
  return "?";
}

std::string_view to_string(Pass p) {
  switch (p) {
    case Pass::kNone:
      return "none";
    case Pass::kForward:
      return "fwd";
    case Pass::kBackward:
      return "bwd";
    case Pass::kBackwardInput:
      return "bwd_i";
    case Pass::kBackwardWeight:
      return "bwd_w";
    case Pass::kRecompute:
      return "recompute";
  }
  return "?";
}

std::string_view to_string(ReduceOp r) {
  switch (r) {
    case ReduceOp::kNone:
      return "none";
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::string_view to_string(BodyOp op) {
  switch (op) {
    case BodyOp::kNone:
      return "none";
    case BodyOp::kEmbedTokens:
      return "embed.tokens";
    case BodyOp::kEmbedPositions:
      return "embed.positions";
    case BodyOp::kAttnNorm:
      return "attn.norm";
    case BodyOp::kAttnQkv:
      return "attn.qkv";
    case BodyOp::kAttnRope:
      return "attn.rope";
    case BodyOp::kAttnCore:
      return "attn.core";
    case BodyOp::kAttnProj:
      return "attn.proj";
    case BodyOp::kAttnResidual:
      return "attn.residual";
    case BodyOp::kMlpNorm:
      return "mlp.norm";
    case BodyOp::kMlpFc1:
      return "mlp.fc1";
    case BodyOp::kMlpAct:
      return "mlp.act";
    case BodyOp::kMlpFc2:
      return "mlp.fc2";
    case BodyOp::kMlpResidual:
      return "mlp.residual";
    case BodyOp::kHeadNorm:
      return "head.norm";
    case BodyOp::kHeadLogits:
      return "head.logits";
    case BodyOp::kHeadCrossEntropy:
      return "head.cross_entropy";
    case BodyOp::kMoeRoute:
      return "moe.route";
    case BodyOp::kMoeExperts:
      return "moe.experts";
    case BodyOp::kMoeShared:
      return "moe.shared";
    case BodyOp::kMoeCombine:
      return "moe.combine";
  }
  return "?";
}

std::optional<BodyOp> parse_body_op(std::string_view t) {
  for (int i = static_cast<int>(BodyOp::kNone) + 1; i <= static_cast<int>(BodyOp::kMoeCombine); ++i) {
    auto op = static_cast<BodyOp>(i);
    if (to_string(op) == t) return op;
  }
  return std::nullopt;
}

std::string_view to_string(BodyKind k) {
  switch (k) {
    case BodyKind::kForward:
      return "fwd";
    case BodyKind::kBackward:
      return "bwd";
    case BodyKind::kBackwardInput:
      return "bwd_i";
    case BodyKind::kBackwardWeight:
      return "bwd_w";
  }
  return "?";
}

std::string to_text(const Instr& in) {
  std::string s(to_string(in.op));
  auto field = [&](const char* key, auto value) { s += fmt::format(" {}={}", key, value); };
  if (in.op == Opcode::kCompute) field("op", to_string(in.body_op));
  if (in.is_collective()) field("on", to_string(in.on));
  if (in.what != What::kNone) field("what", to_string(in.what));
  if (in.pass != Pass::kNone) field("pass", to_string(in.pass));
  if (in.chunk >= 0) field("chunk", in.chunk);
  if (in.mb >= 0) field("mb", in.mb);
  if (in.layer != -1 || in.layer_end != -1) {
    if (in.layer_end != -1)
      s += fmt::format(" layers={}..{}", in.layer, in.layer_end);
    else
      field("layer", in.layer);
  }
  if (in.index >= 0) field("index", in.index);
  if (in.peer >= 0) field("peer", in.peer);
  if (in.is_p2p() || in.is_collective()) {
    field("count", in.count);
    field("dtype", to_string(in.dtype));
  }
  if (in.reduce != ReduceOp::kNone) field("op", to_string(in.reduce));
  if (in.group >= 0) field("group", in.group);
  return s;
}

const Body* Program::body(std::int32_t chunk, BodyKind kind) const {
  for (const auto& b : bodies) {
    if (b->chunk == chunk && b->kind == kind) return b.get();
  }
  return nullptr;
}

const ChunkInfo* Program::chunk_info(std::int32_t chunk) const {
  for (const auto& c : chunks) {
    if (c.index == chunk) return &c;
  }
  return nullptr;
}

std::vector<std::int32_t> Program::members(CommGroup g) const {
  switch (g) {
    case CommGroup::kTp:
      return tp_group;
    case CommGroup::kPp:
      return pp_group;
    case CommGroup::kDp:
      return dp_group;
    case CommGroup::kEmbedding:
      return embedding_group;
    case CommGroup::kEp:
      return ep_group;
    case CommGroup::kEdp:
      return edp_group;
    case CommGroup::kCp:
      return cp_group;
    case CommGroup::kWorld: {
      std::vector<std::int32_t> all(static_cast<std::size_t>(world));
      std::iota(all.begin(), all.end(), 0);
      return all;
    }
    case CommGroup::kNone:
      return {};
  }
  return {};
}

bool Program::operator==(const Program& o) const {
  if (rank != o.rank || world != o.world || plan_digest != o.plan_digest || model_digest != o.model_digest ||
      tp != o.tp || pp != o.pp || dp != o.dp || vpp != o.vpp || tp_rank != o.tp_rank || pp_rank != o.pp_rank ||
      dp_rank != o.dp_rank || cp != o.cp || cp_rank != o.cp_rank || cp_group != o.cp_group ||
      micro_batch != o.micro_batch || num_microbatches != o.num_microbatches || layers != o.layers ||
      schedule_name != o.schedule_name || sequence_parallel != o.sequence_parallel ||
      distributed_optimizer != o.distributed_optimizer || fsdp != o.fsdp || tp_group != o.tp_group ||
      pp_group != o.pp_group || dp_group != o.dp_group || embedding_group != o.embedding_group || ep != o.ep ||
      ep_rank != o.ep_rank || etp != o.etp || ep_group != o.ep_group || edp_group != o.edp_group ||
      chunks != o.chunks || schedule != o.schedule || bodies.size() != o.bodies.size()) {
    return false;
  }
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    if (!(*bodies[i] == *o.bodies[i])) return false;
  }
  return true;
}

std::string p2p_slice_name(const Instr& in) {
  const bool send = in.op == Opcode::kSend;
  return fmt::format("{} {} c{} mb{} {} {}", send ? "SEND" : "RECV", to_string(in.what), in.chunk, in.mb,
                     send ? "->" : "<-", in.peer);
}

std::string collective_slice_name(const Instr& in) {
  return fmt::format("{} {}{}", to_string(in.op), to_string(in.what),
                     in.index >= 0 ? fmt::format(" #{}", in.index) : "");
}

std::string compute_slice_name(const Instr& in) {
  if (in.op == Opcode::kOptimizerStep) return "optimizer";
  const std::string_view k = in.op == Opcode::kForward         ? "F"
                             : in.op == Opcode::kBackward      ? "B"
                             : in.op == Opcode::kBackwardInput ? "BI"
                                                               : "W";
  std::string name = fmt::format("{} c{} mb{}", k, in.chunk, in.mb);
  if (in.layer_end >= 0) name += fmt::format(" L{}..{}", in.layer, in.layer_end);
  return name;
}

std::string compute_slice_category(const Instr& in) {
  switch (in.op) {
    case Opcode::kForward:
      return "forward";
    case Opcode::kBackward:
      return "backward";
    case Opcode::kBackwardInput:
      return "backward_input";
    case Opcode::kBackwardWeight:
      return "backward_weight";
    case Opcode::kOptimizerStep:
      return "optimizer";
    default:
      return "other";
  }
}

std::string describe(const Program& p, std::size_t pc) {
  if (pc >= p.schedule.size()) return fmt::format("rank {} pc {} (end of program)", p.rank, pc);
  return fmt::format("rank {} pc {} ({})", p.rank, pc, to_text(p.schedule[pc]));
}

}  // namespace dtrain::ir
