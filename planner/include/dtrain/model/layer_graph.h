// The layer graph: the ops of one transformer layer, of the embedding and of the head, in execution order, each with
// its forward FLOPs, bytes moved, parameters and activation bytes kept for backward.
//
// Quantities are for the whole (unpartitioned) model and per token of a micro-batch, so the cost model multiplies by
// micro_batch * seq_len and divides by the tensor-parallel degree according to each op's split; the lowering uses
// the split to insert the tensor-parallel collectives. Activation accounting follows Korthikanti et al. 2022
// (Reducing Activation Recomputation in Large Transformer Models), Table 2: with fp16 activations, no parallelism and
// materialised attention with dropout, one GPT layer keeps s*b*h*(34 + 5*a*s/h) bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/model/model_spec.h"

namespace dtrain::model {

enum class OpKind {
  kTokenEmbedding,   // vocab-parallel lookup (+ learned positions, + dropout)
  kNorm,             // LayerNorm or RMSNorm
  kLinear,           // GEMM: tokens x in_features -> tokens x out_features
  kRope,             // rotary position embedding on queries and keys
  kAttention,        // core attention on the local heads (QK^T, mask, softmax, dropout, AV)
  kActivation,       // GELU or SwiGLU
  kDropoutResidual,  // dropout (when the model has it) fused with the residual add
  kCrossEntropy,     // vocab-parallel softmax cross entropy
  kPermute,          // mixture of experts: tokens copied to their experts' rows and the outputs summed back
};

// How tensor parallelism splits an op.
enum class TpSplit {
  kSequence,    // replicated over the tensor-parallel group; split along the sequence with sequence parallelism
  kColumn,      // weight split by output features; input replicated (all-gathered with sequence parallelism)
  kRow,         // weight split by input features; output partial sums all-reduced (reduce-scattered with SP)
  kHeads,       // attention heads split over the group (follows a column-parallel op)
  kVocab,       // embedding rows / output logits split over the vocabulary
  kReplicated,  // the whole op on every rank of the group, on all tokens (an MoE router)
};

// The part of a mixture-of-experts layer's MLP an op belongs to (kNone: attention, norms, a dense MLP, the
// embedding and the head). The planner and the lowering dispatch on it, never on an op's name.
enum class MoePart {
  kNone,
  kRouter,         // the router's linear layer, softmax and top-k
  kPermute,        // tokens copied to their experts' rows and the outputs summed back
  kExperts,        // the routed experts' grouped GEMMs and activation
  kSharedExperts,  // the shared experts' MLP
  kSharedGate,     // the shared experts' sigmoid gate
};

std::string_view to_string(OpKind kind);
std::string_view to_string(TpSplit split);

struct Op {
  std::string name;  // "attn.qkv", "mlp.fc2", "head.cross_entropy", ...
  OpKind kind = OpKind::kLinear;
  TpSplit split = TpSplit::kSequence;
  // GEMM features (kLinear only; full, before partitioning).
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  // Forward FLOPs per token (full). Attention: both products counted over the whole sequence (see causal_fraction).
  double flops_per_token = 0;
  // Fraction of the attention products actually computed (0.5 for a causal flash kernel that skips masked tiles).
  double causal_fraction = 1.0;
  // Forward HBM traffic per token of the non-GEMM work (elementwise passes), bytes, full.
  double bytes_per_token = 0;
  // Backward cost relative to forward: GEMMs 2 (input and weight gradients), flash attention 2.5 (recomputes the
  // scores), elementwise ops about 2 (read the saved input and the output gradient, write the input gradient).
  double backward_factor = 2.0;
  std::int64_t params = 0;  // full parameter count
  // Activation bytes kept for backward, per token, full:
  double saved_sharded_per_token = 0;   // divided by the tensor-parallel degree
  double saved_sequence_per_token = 0;  // divided by it only with sequence parallelism
  double saved_quadratic_per_token =
      0;  // the attention scores' s*s part: divided by tp, dropped by selective recompute
  double saved_replicated_per_token = 0;  // kept whole on every rank of the group (an MoE router's state)
  // A grouped GEMM over the experts (kLinear): `experts` GEMMs, each on tokens * top_k / experts rows on average.
  std::int64_t experts = 0;
  std::int64_t top_k = 1;
  MoePart moe = MoePart::kNone;
  bool is_moe() const { return moe != MoePart::kNone; }
};

struct LayerGraph {
  std::vector<Op> embedding;  // first pipeline stage
  std::vector<Op> layer;      // one dense transformer layer
  // One MoE layer (an MoE model's; empty for a dense model): the dense layer's attention and norm, then the router,
  // the experts (grouped GEMMs), the shared experts and the permutations, in place of the MLP.
  std::vector<Op> moe_layer;
  std::vector<bool> moe;        // per layer: whether it is an MoE layer (empty for a dense model)
  std::vector<int> moe_before;  // MoE layers among [0, l), layers + 1 entries (empty for a dense model)
  std::vector<Op> head;         // last pipeline stage: final norm, output projection, cross entropy

  bool is_moe(std::int64_t l) const { return l >= 0 && l < static_cast<std::int64_t>(moe.size()) && moe[l]; }
  const std::vector<Op>& layer_ops(std::int64_t l) const { return is_moe(l) ? moe_layer : layer; }
  // MoE layers among [first, first + n).
  int moe_layers_in(int first, int n) const {
    if (moe_before.empty() || n <= 0) return 0;  // a dense model
    const auto begin = static_cast<std::size_t>(first);
    return moe_before[begin + static_cast<std::size_t>(n)] - moe_before[begin];
  }
};

// Builds the graph for a model trained in training.dtype with training.attention.
LayerGraph build_layer_graph(const ModelSpec& model, const TrainingSpec& training);

// Sums over a list of ops.
double sum_params(const std::vector<Op>& ops);
double sum_forward_flops_per_token(const std::vector<Op>& ops);

}  // namespace dtrain::model
