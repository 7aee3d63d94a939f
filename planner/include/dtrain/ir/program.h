// The dtrain IR: one program per rank, in two levels (docs/ir.md).
//
// The schedule is what the rank does in one training step, in order: load a micro-batch, forward or backward (or
// input-gradient and weight-gradient) of one model chunk on one micro-batch, send/receive activations and
// gradients (consecutive point-to-point instructions with the same group id complete together, like an
// ncclGroupStart/End block), data-parallel reduction per bucket, the tied-embedding gradient reduction, the gradient
// norm, the optimizer step, the checkpoint.
//
// A stage body is what one forward or backward of a chunk runs: the layer graph's ops after tensor-parallel
// partitioning (column/row-parallel linear layers, attention on the local heads, vocab-parallel embedding and cross
// entropy) with the collectives partitioning inserts (all-reduce; all-gather/reduce-scatter along the sequence with
// sequence parallelism). Body ops carry their layer, so a backward can run a range of layers (how the last
// micro-batch's backward is cut at bucket boundaries to overlap the data-parallel reduction).
//
// Every instruction has a program counter (its index). Point-to-point instructions carry a stable key (what, chunk,
// micro-batch, the peer) so pairing is never inferred; collectives carry what they reduce, so that two collectives
// issued in a different order on two ranks are reported, not silently paired.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/common/dtype.h"
#include "dtrain/model/layout_fit.h"

namespace dtrain::ir {

enum class Opcode : std::uint8_t {
  // schedule
  kLoad,            // LOAD what=tokens|targets|batch mb=J
  kForward,         // FWD chunk=C mb=J
  kBackward,        // BWD chunk=C mb=J [layers=A..B]  input and weight gradients
  kBackwardInput,   // BWD_I chunk=C mb=J               input gradients only (zero-bubble schedules)
  kBackwardWeight,  // BWD_W chunk=C mb=J               weight gradients only
  kSend,            // SEND what=act|grad chunk=C mb=J peer=R count=N dtype=D [group=G]
  kRecv,            // RECV what=act|grad chunk=C mb=J peer=R count=N dtype=D [group=G]
  kAllReduce,       // ALLREDUCE on=GROUP what=... count=N dtype=D op=sum|max [chunk bucket layer index]
  kAllGather,       // ALLGATHER  (count: the gathered size)
  kReduceScatter,   // REDUCESCATTER (count: the input size)
  kOptimizerStep,   // OPTIM
  kCheckpoint,      // CKPT (the executor decides whether this step writes one)
  // stage bodies
  kCompute,  // COMPUTE op=attn.qkv layer=L pass=fwd|bwd|bwd_i|bwd_w|recompute
  // ALLTOALL on=ep what=expert_counts|expert_tokens count=N dtype=D: every member sends count elements to every
  // member (itself included) and receives as many from each. For expert_tokens the count is the balanced expectation
  // (the micro-batch's routed rows spread evenly); the executor sends the rows the router chose, whose per-peer
  // numbers the expert_counts all-to-all before it exchanged.
  kAllToAll,
  // RING on=cp what=kv|kv_grad count=N dtype=D: context parallelism's ring exchange (cp_comm=p2p), a collective of
  // the cp group in program order. what=kv, before an attention: the attention runs over the cp ranks' key/value
  // blocks (count: one rank's) in cp steps, each sending the block in hand to the next cp rank and receiving the
  // previous one's while it computes on it (in a backward the blocks' gradients travel one step behind them).
  // what=kv_grad, after an attention's backward: the last hop, each block's summed gradients to its own rank.
  kRing,
};

// The communicator a collective runs on.
// kEp: the expert-parallel group (ep consecutive data-parallel ranks); kEdp: the expert-data-parallel group (the
// data-parallel ranks holding the same experts), over which the experts' gradients are reduced. kCp: the
// context-parallel group (the cp ranks sharing one replica's sequences). With cp > 1, kDp is the data-parallel group
// with context parallelism (the dp x cp ranks holding the same parameters).
enum class CommGroup : std::uint8_t { kNone, kTp, kPp, kDp, kWorld, kEmbedding, kEp, kEdp, kCp };

// What an instruction moves or computes on.
enum class What : std::uint8_t {
  kNone,
  kTokens,            // LOAD: input token ids (first chunk)
  kTargets,           // LOAD: target token ids (last chunk)
  kBatch,             // LOAD: both (one stage)
  kActivation,        // SEND/RECV: a chunk's output, forward
  kGradient,          // SEND/RECV: the gradient of a chunk's input, backward
  kHidden,            // tensor-parallel collective on the hidden state (or its gradient)
  kLogitsMax,         // vocab-parallel cross entropy: per-token max
  kLogitsSumExp,      // vocab-parallel cross entropy: per-token sum of exponentials
  kTargetLogit,       // vocab-parallel cross entropy: the target's logit
  kGradBucket,        // data-parallel gradient bucket: the gradients of layers [layer, layer_end) of a chunk
  kParamBucket,       // distributed optimizer: updated parameters of a bucket (with ep > 1 its experts' on=edp)
  kEmbeddingGrad,     // tied word-embedding gradients (on=embedding: summed between the first and last stage; on=dp:
                      // reduced over data parallelism)
  kGradNorm,          // sum of squares of the gradients
  kLoss,              // sum of the micro-batch losses (reported by global rank 0)
  kEmbeddingParams,   // distributed optimizer: updated tied word embeddings
  kSavedInput,        // sequence parallelism: a column-parallel layer's saved input shard, re-gathered for its
                      // weight gradient
  kReplicatedGrads,   // sequence parallelism: gradients of parameters replicated over the tensor-parallel group
                      // (norms, row-parallel biases, positions) are partial sums over sequence shards
  kRouterGrad,        // mixture of experts: the gates' gradients (top_k per token, and the shared experts' gate),
                      // partial sums over the experts' tensor-parallel shards
  kExpertCounts,      // ALLTOALL on=ep: how many routed rows each member sends each of the receiver's experts
  kExpertTokens,      // ALLTOALL on=ep: routed rows (index 0 dispatch, 1 combine; their gradients in the backward)
  kExpertGradBucket,  // ALLREDUCE/REDUCESCATTER on=edp: a bucket's routed experts' gradients (the rest on=dp)
  kLayerParams,       // fsdp, in a body: ALLGATHER on=dp|edp layer=U of unit U's parameters (-1 the embedding, `layers`
                      // the head; on=edp its routed experts'), one unit ahead of the unit whose ops use them; a pass
                      // keeps a unit until two more were gathered after it. REDUCESCATTER what=grad_bucket (or
                      // expert_grad_bucket) layer=U after the unit's backward sums its gradients into their shards.
  kKv,                // context parallelism, in a body: ALLGATHER on=cp layer=L of layer L's keys and values (count:
                      // the whole sequences'), before the attention that reads them (forward, recomputation, backward);
                      // with cp_comm=p2p RING on=cp layer=L (count: this rank's block)
  kKvGrad,            // REDUCESCATTER on=cp layer=L of the keys' and values' gradients after the attention's backward
                      // (count: the whole sequences'), each rank keeping its chunks'; with cp_comm=p2p RING on=cp
                      // layer=L, the gradients' last hop (count: one block)
  kRouterStats,       // ALLREDUCE on=cp layer=L after a MoE layer's router with a load-balancing loss: per sequence of
                      // the micro-batch and expert, the rank's routed choices and router probabilities (count:
                      // micro_batch x experts x 2, fp32), summed over the cp ranks that hold the sequence's chunks
  kHeads,             // context parallelism with cp_comm=a2a, in a body: ALLTOALL on=cp layer=L before an attention
                      // (forward, recomputation, backward; count: what each member sends each, this rank's rows of
                      // one head group's queries, keys and values). The attention runs on head groups: each member
                      // all positions of heads/cp query and kv_heads/cp key/value heads, its output (and in the
                      // backward the gradients) exchanged back to the sequence chunks (DeepSpeed-Ulysses)
};

// The model op a COMPUTE instruction of a stage body runs: the layer graph's ops (dtrain/model/layer_graph.h) plus
// the learned position embedding, which lowering adds after the token lookup. The text form is the layer graph's
// name (to_string: "attn.qkv"); the executor dispatches on the kind with a switch, so an op added here is a compile
// error (-Wswitch) until every pass handles it.
enum class BodyOp : std::uint8_t {
  kNone,              // not a COMPUTE instruction
  kEmbedTokens,       // embed.tokens        vocab-parallel token embedding
  kEmbedPositions,    // embed.positions     learned position embedding (+ embedding dropout)
  kAttnNorm,          // attn.norm
  kAttnQkv,           // attn.qkv            column-parallel
  kAttnRope,          // attn.rope
  kAttnCore,          // attn.core           attention on the local heads
  kAttnProj,          // attn.proj           row-parallel
  kAttnResidual,      // attn.residual       bias + dropout + residual
  kMlpNorm,           // mlp.norm
  kMlpFc1,            // mlp.fc1             column-parallel
  kMlpAct,            // mlp.act             GELU or SwiGLU
  kMlpFc2,            // mlp.fc2             row-parallel
  kMlpResidual,       // mlp.residual
  kHeadNorm,          // head.norm
  kHeadLogits,        // head.logits         vocab-parallel output projection
  kHeadCrossEntropy,  // head.cross_entropy  vocab-parallel cross entropy
  kMoeRoute,          // moe.route           router, top-k, tokens copied to their experts' rows
  kMoeExperts,        // moe.experts         each expert's MLP on its rows (split over tp as a dense MLP)
  kMoeShared,         // moe.shared          the shared experts' MLP (and its gate)
  kMoeCombine,        // moe.combine         the experts' rows summed back per token, weighted by the gates
};

// Which pass a body op belongs to.
enum class Pass : std::uint8_t { kNone, kForward, kBackward, kBackwardInput, kBackwardWeight, kRecompute };

enum class ReduceOp : std::uint8_t { kNone, kSum, kMax };

std::string_view to_string(Opcode op);
std::string_view to_string(CommGroup g);
std::string_view to_string(What w);
std::string_view to_string(Pass p);
std::string_view to_string(ReduceOp r);
std::string_view to_string(BodyOp op);
std::optional<Opcode> parse_opcode(std::string_view text);
// The op named `text` ("attn.qkv"); nullopt for any other text ("none" included).
std::optional<BodyOp> parse_body_op(std::string_view text);

struct Instr {
  Opcode op = Opcode::kCompute;
  What what = What::kNone;
  CommGroup on = CommGroup::kNone;
  Pass pass = Pass::kNone;
  ReduceOp reduce = ReduceOp::kNone;
  DType dtype = DType::kFp32;
  std::int32_t chunk = -1;         // model chunk (global chunk index)
  std::int32_t mb = -1;            // micro-batch
  std::int32_t peer = -1;          // SEND/RECV: the other global rank
  std::int32_t group = -1;         // SEND/RECV: instructions of one group complete together
  std::int32_t layer = -1;         // body op: layer (-1 embedding, `layers` the head); BWD or bucket range start
  std::int32_t layer_end = -1;     // BWD or bucket range end (exclusive); -1 = the whole chunk
  std::int32_t index = -1;         // bucket index; collective index within a layer; model-op index in the layer graph
  std::int64_t count = 0;          // elements
  BodyOp body_op = BodyOp::kNone;  // COMPUTE: the model op ("op=attn.qkv" in the text); kNone otherwise

  bool is_p2p() const { return op == Opcode::kSend || op == Opcode::kRecv; }
  bool is_collective() const {
    return op == Opcode::kAllReduce || op == Opcode::kAllGather || op == Opcode::kReduceScatter ||
           op == Opcode::kAllToAll || op == Opcode::kRing;
  }
  bool is_compute_pass() const {
    return op == Opcode::kForward || op == Opcode::kBackward || op == Opcode::kBackwardInput ||
           op == Opcode::kBackwardWeight;
  }
  bool operator==(const Instr& o) const = default;
};

// One line of text, without the pc: "SEND what=act chunk=0 mb=3 peer=5 count=131072 dtype=fp32 group=2".
std::string to_text(const Instr& instr);

enum class BodyKind : std::uint8_t { kForward, kBackward, kBackwardInput, kBackwardWeight };
std::string_view to_string(BodyKind k);

// The ops of one pass over one chunk, in execution order.
struct Body {
  std::int32_t chunk = 0;
  BodyKind kind = BodyKind::kForward;
  std::vector<Instr> instrs;
  bool operator==(const Body& o) const = default;
};

// A model chunk held by this rank: global chunk index, its layers [first_layer, first_layer + layers), and whether
// it holds the embedding (first chunk) and the head (last chunk).
struct ChunkInfo {
  std::int32_t index = 0;
  std::int32_t first_layer = 0;
  std::int32_t layers = 0;
  bool embedding = false;
  bool head = false;
  bool operator==(const ChunkInfo& o) const = default;
};

struct Program {
  std::int32_t rank = 0;
  std::int32_t world = 1;
  std::string plan_digest;
  std::string model_digest;
  // layout
  std::int32_t tp = 1, pp = 1, dp = 1, vpp = 1;
  std::int32_t tp_rank = 0, pp_rank = 0, dp_rank = 0;
  // Context parallelism: this rank holds chunks cp_rank and 2 * cp - 1 - cp_rank of the 2 * cp chunks of every
  // sequence. dp_group is then the dp x cp ranks holding the same parameters (group rank dp_rank * cp + cp_rank).
  std::int32_t cp = 1, cp_rank = 0;
  // The rank's index in dp_group and its size: over those the gradients are reduced and the optimizer state sharded.
  std::int32_t dp_cp() const { return dp * cp; }
  std::int32_t dp_cp_rank() const { return dp_rank * cp + cp_rank; }
  // Expert parallelism (an MoE model's, ep > 1): this rank holds experts [ep_rank * E / ep, (ep_rank + 1) * E / ep).
  std::int32_t ep = 1, ep_rank = 0;
  // Expert tensor parallelism: 0 when the experts are split over tp like a dense MLP; 1 (under tp > 1) when every
  // tensor-parallel rank runs whole experts on its own sequence shard.
  std::int32_t etp = 0;
  bool moe_token_parallel() const { return etp == 1 && tp > 1; }
  std::int32_t micro_batch = 1, num_microbatches = 1;
  // The degrees that cut the model's tensors (dtrain/model/layout_fit.h).
  model::ShardDegrees shard_degrees() const { return {tp, ep, etp, micro_batch, sequence_parallel}; }
  std::int32_t layers = 0;    // of the whole model
  std::string schedule_name;  // gpipe | 1f1b | interleaved | zb-h1
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  // Fully sharded data parallelism: parameters gathered and gradients reduce-scattered unit by unit in the bodies
  // (What::kLayerParams); no bucketed reduction in the schedule, no parameter all-gather after the optimizer step.
  bool fsdp = false;
  // communicators, as global ranks in group-rank order
  std::vector<std::int32_t> tp_group, pp_group, dp_group, embedding_group;
  std::vector<std::int32_t> ep_group, edp_group;  // empty unless ep > 1
  std::vector<std::int32_t> cp_group;             // empty unless cp > 1
  std::vector<ChunkInfo> chunks;
  // Bodies are shared between the ranks of one stage (they differ only in their communicators).
  std::vector<std::shared_ptr<const Body>> bodies;
  std::vector<Instr> schedule;

  const Body* body(std::int32_t chunk, BodyKind kind) const;
  const ChunkInfo* chunk_info(std::int32_t chunk) const;
  // The global ranks of a communicator (kWorld: every rank; kNone: empty).
  std::vector<std::int32_t> members(CommGroup g) const;
  bool operator==(const Program& o) const;
};

// "rank 3 pc 12 (SEND what=act chunk=1 mb=0 peer=5 ...)": how every message about an instruction names it.
std::string describe(const Program& p, std::size_t pc);
// "SEND act c1 mb0 -> 5", "RECV grad c1 mb0 <- 8": the timeline name of a point-to-point instruction, the same in the
// simulator's trace and in the executor's measured one (dtplan compare matches them).
std::string p2p_slice_name(const Instr& in);
// "ALLREDUCE replicated_grads", "REDUCESCATTER grad_bucket #0": the timeline name of a collective, shared likewise.
std::string collective_slice_name(const Instr& in);
// "F c0 mb3", "B c1 mb0 L1..4" (a backward piece over layers 1 to 4), "optimizer": the timeline name of a compute
// instruction, and its category ("forward", "backward", "backward_input", "backward_weight", "optimizer"), shared
// likewise.
std::string compute_slice_name(const Instr& in);
std::string compute_slice_category(const Instr& in);

}  // namespace dtrain::ir
