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

}  // namespace

LayerGraph build_layer_graph(const ModelSpec& m, const TrainingSpec& t) {
  const double e = activation_bytes(t.dtype);
  const double h = static_cast<double>(m.hidden);
  const double s = static_cast<double>(m.seq_len);
  const double a = static_cast<double>(m.heads);
  const double kv = static_cast<double>(m.kv_dim());
  const double f = static_cast<double>(m.ffn_hidden);
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
      // per-row log-sum-exp (fp32).
      op.causal_fraction = 0.5;
      op.bytes_per_token = e * (2.0 * h + 2.0 * kv);
      op.saved_sharded_per_token = e * (2.0 * h + 2.0 * kv) + 4.0 * a;
      op.backward_factor = 2.5;
    }
    g.layer.push_back(op);
  }
  g.layer.push_back(linear("attn.proj", TpSplit::kRow, m.hidden, m.hidden, m.linear_bias, e));
  g.layer.push_back(dropout_residual("attn.residual", m, e));
  g.layer.push_back(norm("mlp.norm", m, e));
  g.layer.push_back(linear("mlp.fc1", TpSplit::kColumn, m.hidden, m.fc1_columns(), m.linear_bias, e));
  {
    Op op;
    op.name = "mlp.act";
    op.kind = OpKind::kActivation;
    op.split = TpSplit::kHeads;
    double in = static_cast<double>(m.fc1_columns());
    op.bytes_per_token = e * (in + f);    // read the pre-activation (gate and up for SwiGLU), write the product
    op.saved_sharded_per_token = e * in;  // GELU keeps its input; SwiGLU keeps gate and up
    op.flops_per_token = 8.0 * f;
    g.layer.push_back(op);
  }
  g.layer.push_back(linear("mlp.fc2", TpSplit::kRow, m.ffn_hidden, m.hidden, m.linear_bias, e));
  g.layer.push_back(dropout_residual("mlp.residual", m, e));

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
