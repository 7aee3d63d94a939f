#include "dtrain/model/layer_graph.h"

namespace dtrain::model {

std::string_view to_string(OpKind kind) {
  switch (kind) {
    case OpKind::kTokenEmbedding:
      return "embedding";
    case OpKind::kNorm:
      return "norm";
    case OpKind::kLinear:
      return "linear";
    case OpKind::kRope:
      return "rope";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kActivation:
      return "activation";
    case OpKind::kDropoutResidual:
      return "dropout_residual";
    case OpKind::kCrossEntropy:
      return "cross_entropy";
    case OpKind::kPermute:
      return "permute";
  }
  return "?";
}

std::string_view to_string(TpSplit split) {
  switch (split) {
    case TpSplit::kSequence:
      return "sequence";
    case TpSplit::kColumn:
      return "column";
    case TpSplit::kRow:
      return "row";
    case TpSplit::kHeads:
      return "heads";
    case TpSplit::kVocab:
      return "vocab";
    case TpSplit::kReplicated:
      return "replicated";
  }
  return "?";
}

namespace {

Op linear(std::string name, TpSplit split, std::int64_t in, std::int64_t out, bool bias, double e) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::kLinear;
  op.split = split;
  op.in_features = in;
  op.out_features = out;
  op.flops_per_token = 2.0 * static_cast<double>(in) * static_cast<double>(out);
  op.params = in * out + (bias ? out : 0);
  // A linear layer keeps its input for the weight gradient. A column-parallel layer's input is the full hidden
  // state on every rank (the sequence shard with sequence parallelism); a row-parallel layer's input is already
  // split over the group.
  if (split == TpSplit::kColumn)
    op.saved_sequence_per_token = e * static_cast<double>(in);
  else
    op.saved_sharded_per_token = e * static_cast<double>(in);
  return op;
}

Op norm(std::string name, const ModelSpec& m, double e) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::kNorm;
  op.split = TpSplit::kSequence;
  op.params = m.norm == NormKind::kLayerNorm ? 2 * m.hidden : m.hidden;
  op.bytes_per_token = 2.0 * e * static_cast<double>(m.hidden);  // read x, write y
  op.saved_sequence_per_token = e * static_cast<double>(m.hidden);
  op.flops_per_token = 8.0 * static_cast<double>(m.hidden);
  return op;
}

Op dropout_residual(std::string name, const ModelSpec& m, double e) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::kDropoutResidual;
  op.split = TpSplit::kSequence;
  double h = static_cast<double>(m.hidden);
  op.bytes_per_token = 3.0 * e * h;  // read branch and residual, write the sum
  op.flops_per_token = 2.0 * h;
  if (m.dropout > 0.0) {
    op.bytes_per_token += h;          // the one-byte mask
    op.saved_sequence_per_token = h;  // mask kept for backward
  }
  op.backward_factor = 1.0;  // the gradient passes through; with dropout one multiply by the mask
  return op;
}

// The activation of an MLP of width f over `rows` rows per token (top_k for the routed experts).
Op activation(std::string name, const ModelSpec& m, std::int64_t f, double rows, double e) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::kActivation;
  op.split = TpSplit::kHeads;
  const double in = static_cast<double>(m.fc1_columns(f));
  op.bytes_per_token = rows * e * (in + static_cast<double>(f));  // read the pre-activation, write the product
  op.saved_sharded_per_token = rows * e * in;                     // GELU keeps its input; SwiGLU keeps gate and up
  op.flops_per_token = rows * 8.0 * static_cast<double>(f);
  return op;
}

// The MLP of an MoE layer, as dtrain's executor runs it (executor/runtime/src/moe_ops.cc): the router (a linear
// layer to the experts' logits, replicated over tensor parallelism), the tokens copied to their experts' rows,
// each expert's MLP over its rows (the experts' matrices split over tp as a dense MLP's), the outputs summed back
// with the gates; the shared experts as a dense MLP beside them.
void add_moe_layer(LayerGraph& g, const ModelSpec& m, double e) {
  const MoeSpec& moe = m.moe;
  const double h = static_cast<double>(m.hidden), k = static_cast<double>(moe.top_k);
  const double E = static_cast<double>(moe.experts);
  for (const Op& op : g.layer) {
    if (op.name.rfind("mlp.fc1", 0) == 0) break;
    g.moe_layer.push_back(op);  // attention and the MLP's norm
  }
  Op router = linear("moe.router", TpSplit::kReplicated, m.hidden, moe.experts, false, e);
  // The router keeps its (gathered) input, the fp32 probabilities, and each choice's expert, gate and row.
  router.saved_sequence_per_token = 0;
  router.saved_sharded_per_token = 0;
  router.saved_replicated_per_token = e * h + 4.0 * E + 12.0 * k;
  router.bytes_per_token = 2.0 * 4.0 * E;  // softmax and top-k over the fp32 probabilities
  router.moe = MoePart::kRouter;
  g.moe_layer.push_back(router);
  {
    Op op;
    op.name = "moe.permute";
    op.kind = OpKind::kPermute;
    op.split = TpSplit::kReplicated;
    // Dispatch reads each token and writes top_k rows; combine reads top_k rows and writes the token.
    op.bytes_per_token = 2.0 * e * h * (1.0 + k);
    // The experts' input rows and their output rows (the gates' gradient reads them).
    op.saved_replicated_per_token = 2.0 * e * h * k;
    op.backward_factor = 1.5;  // the output gradient copied to the rows, the gates' gradients, the input summed
    op.moe = MoePart::kPermute;
    g.moe_layer.push_back(op);
  }
  Op fc1 = linear("moe.experts.fc1", TpSplit::kColumn, m.hidden, m.expert_fc1_columns(), false, e);
  fc1.params *= moe.experts;
  fc1.flops_per_token *= k;
  fc1.saved_sequence_per_token = 0;  // its input is the permutation's rows
  fc1.experts = moe.experts;
  fc1.top_k = moe.top_k;
  fc1.moe = MoePart::kExperts;
  g.moe_layer.push_back(fc1);
  g.moe_layer.push_back(activation("moe.experts.act", m, moe.ffn_hidden, k, e));
  g.moe_layer.back().moe = MoePart::kExperts;
  Op fc2 = linear("moe.experts.fc2", TpSplit::kRow, moe.ffn_hidden, m.hidden, false, e);
  fc2.params *= moe.experts;
  fc2.flops_per_token *= k;
  fc2.saved_sharded_per_token *= k;
  fc2.experts = moe.experts;
  fc2.top_k = moe.top_k;
  fc2.moe = MoePart::kExperts;
  g.moe_layer.push_back(fc2);
  if (moe.shared_ffn_hidden > 0) {
    g.moe_layer.push_back(linear("moe.shared.fc1", TpSplit::kColumn, m.hidden, m.shared_fc1_columns(), false, e));
    g.moe_layer.back().saved_sequence_per_token = 0;  // the router's input
    g.moe_layer.back().moe = MoePart::kSharedExperts;
    g.moe_layer.push_back(activation("moe.shared.act", m, moe.shared_ffn_hidden, 1.0, e));
    g.moe_layer.back().moe = MoePart::kSharedExperts;
    g.moe_layer.push_back(linear("moe.shared.fc2", TpSplit::kRow, moe.shared_ffn_hidden, m.hidden, false, e));
    g.moe_layer.back().moe = MoePart::kSharedExperts;
    if (moe.shared_gate) {
      g.moe_layer.push_back(linear("moe.shared.gate", TpSplit::kReplicated, m.hidden, 1, false, e));
      g.moe_layer.back().moe = MoePart::kSharedGate;
      g.moe_layer.back().saved_sharded_per_token = 0;
      g.moe_layer.back().saved_replicated_per_token = 4.0 + e * h;  // the gate and the shared output, reduced
    }
  }
  for (const Op& op : g.layer) {
    if (op.name == "mlp.residual") g.moe_layer.push_back(op);
  }
}

}  // namespace

LayerGraph build_layer_graph(const ModelSpec& m, const TrainingSpec& t) {
  const double e = activation_bytes(t.dtype);
  const double h = static_cast<double>(m.hidden);
  const double s = static_cast<double>(m.seq_len);
  const double a = static_cast<double>(m.heads);
  const double kv = static_cast<double>(m.kv_dim());
  LayerGraph g;

  // Embedding: vocab-parallel lookup, learned positions added, dropout. Keeps the dropout mask.
  {
    Op op;
    op.name = "embed.tokens";
    op.kind = OpKind::kTokenEmbedding;
    op.split = TpSplit::kVocab;
    op.params = m.embedding_params();
    op.bytes_per_token = 2.0 * e * h + (m.position == PositionKind::kLearned ? 2.0 * e * h : 0.0);
    if (m.dropout > 0.0) op.saved_sequence_per_token = h;
    op.backward_factor = 1.0;
    g.embedding.push_back(op);
  }

  // One transformer layer (Megatron's order): norm, QKV, [rope], core attention, output projection,
  // dropout + residual, norm, fc1, activation, fc2, dropout + residual.
  g.layer.push_back(norm("attn.norm", m, e));
  g.layer.push_back(linear("attn.qkv", TpSplit::kColumn, m.hidden, m.qkv_columns(), m.has_qkv_bias(), e));
  if (m.position == PositionKind::kRope) {
    Op op;
    op.name = "attn.rope";
    op.kind = OpKind::kRope;
    op.split = TpSplit::kHeads;
    op.bytes_per_token = 2.0 * e * (h + kv);  // rotate queries and keys in place
    op.flops_per_token = 3.0 * (h + kv);
    op.backward_factor = 1.0;
    g.layer.push_back(op);
  }
  {
    Op op;
    op.name = "attn.core";
    op.kind = OpKind::kAttention;
    op.split = TpSplit::kHeads;
    op.flops_per_token = 4.0 * s * h;  // QK^T and AV, each 2*s*head_dim per head per token
    if (t.attention == AttentionImpl::kMaterialized) {
      // Scores scaled, masked and soft-maxed in one fused pass, then dropout: each a read and a write of a*s
      // elements per token. Keeps Q and K (for QK^T), the softmax output, the dropout mask and output, and V.
      op.bytes_per_token = 2.0 * e * a * s;
      op.saved_sharded_per_token = e * (h + 2.0 * kv);
      op.saved_quadratic_per_token = e * a * s;
      if (m.dropout > 0.0) {
        op.bytes_per_token += (2.0 * e + 1.0) * a * s;
        op.saved_quadratic_per_token += (1.0 + e) * a * s;
      }
      op.backward_factor = 2.0;
    } else {
      // A flash kernel computes only the unmasked half of a causal product and keeps Q, K, V, the output and the
      // per-row log-sum-exp (fp32). The output is the projection's saved input, one tensor: counted there.
      op.causal_fraction = 0.5;
      op.bytes_per_token = e * (2.0 * h + 2.0 * kv);
      op.saved_sharded_per_token = e * (h + 2.0 * kv) + 4.0 * a;
      op.backward_factor = 2.5;
    }
    g.layer.push_back(op);
  }
  g.layer.push_back(linear("attn.proj", TpSplit::kRow, m.hidden, m.hidden, m.linear_bias, e));
  g.layer.push_back(dropout_residual("attn.residual", m, e));
  g.layer.push_back(norm("mlp.norm", m, e));
  g.layer.push_back(linear("mlp.fc1", TpSplit::kColumn, m.hidden, m.fc1_columns(), m.linear_bias, e));
  g.layer.push_back(activation("mlp.act", m, m.ffn_hidden, 1.0, e));
  g.layer.push_back(linear("mlp.fc2", TpSplit::kRow, m.ffn_hidden, m.hidden, m.linear_bias, e));
  g.layer.push_back(dropout_residual("mlp.residual", m, e));

  if (m.moe.enabled()) {
    add_moe_layer(g, m, e);
    g.moe_before.push_back(0);
    for (std::int64_t l = 0; l < m.layers; ++l) {
      g.moe.push_back(m.is_moe_layer(l));
      g.moe_before.push_back(g.moe_before.back() + (g.moe.back() ? 1 : 0));
    }
  }

  // Head: final norm, output projection (the embedding matrix when tied), vocab-parallel cross entropy.
  g.head.push_back(norm("head.norm", m, e));
  {
    Op op = linear("head.logits", TpSplit::kVocab, m.hidden, m.vocab, false, e);
    op.params = m.tied_embeddings ? 0 : m.hidden * m.vocab;
    g.head.push_back(op);
  }
  {
    // dtrain's vocab-parallel cross entropy (executor layer_ops.cc) reads the logits in the training dtype, with fp32
    // statistics per token, and keeps the logits for the gradient (not an fp32 softmax, as Megatron does): what is
    // saved is the logits, e bytes per vocabulary entry. The time counts the fp32 work of the kernels.
    Op op;
    op.name = "head.cross_entropy";
    op.kind = OpKind::kCrossEntropy;
    op.split = TpSplit::kVocab;
    double v = static_cast<double>(m.vocab);
    op.bytes_per_token = (e + 4.0 + 4.0) * v;
    op.saved_sharded_per_token = e * v;
    op.flops_per_token = 5.0 * v;
    op.backward_factor = 1.0;
    g.head.push_back(op);
  }
  return g;
}

double sum_params(const std::vector<Op>& ops) {
  double p = 0;
  for (const auto& op : ops) p += static_cast<double>(op.params);
  return p;
}

double sum_forward_flops_per_token(const std::vector<Op>& ops) {
  double f = 0;
  for (const auto& op : ops) f += op.flops_per_token;
  return f;
}

}  // namespace dtrain::model
