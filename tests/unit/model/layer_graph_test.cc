#include "dtrain/model/layer_graph.h"

#include <gtest/gtest.h>

namespace dtrain::model {
namespace {

ModelSpec gpt(std::int64_t layers, std::int64_t hidden, std::int64_t heads, double dropout) {
  ModelSpec m;
  m.name = "g";
  m.layers = layers;
  m.hidden = hidden;
  m.ffn_hidden = 4 * hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.vocab = 51200;
  m.seq_len = 2048;
  m.dropout = dropout;
  return m;
}

// Korthikanti et al. 2022, Table 2: activation bytes of one layer per token with fp16 activations, materialised
// attention and dropout: 34*h + 5*a*s, of which 10*h stays replicated under tensor parallelism (split with sequence
// parallelism), 24*h + 5*a*s splits over the tensor-parallel group, and the 5*a*s part is what selective
// recomputation drops.
TEST(LayerGraph, ActivationBytesMatchKorthikantiTable2) {
  ModelSpec m = gpt(4, 6144, 64, 0.1);
  TrainingSpec t;
  t.dtype = DType::kFp16;
  t.attention = AttentionImpl::kMaterialized;
  LayerGraph g = build_layer_graph(m, t);
  double sharded = 0, sequence = 0, quadratic = 0;
  for (const auto& op : g.layer) {
    sharded += op.saved_sharded_per_token;
    sequence += op.saved_sequence_per_token;
    quadratic += op.saved_quadratic_per_token;
  }
  double h = 6144, a = 64, s = 2048;
  EXPECT_DOUBLE_EQ(sequence, 10 * h);
  EXPECT_DOUBLE_EQ(sharded, 24 * h);
  EXPECT_DOUBLE_EQ(quadratic, 5 * a * s);
}

TEST(LayerGraph, ForwardFlopsOfALayer) {
  ModelSpec m = gpt(1, 1024, 16, 0.0);
  TrainingSpec t;
  LayerGraph g = build_layer_graph(m, t);
  double gemm = 0, attention = 0;
  for (const auto& op : g.layer) {
    if (op.kind == OpKind::kLinear) gemm += op.flops_per_token;
    if (op.kind == OpKind::kAttention) attention += op.flops_per_token;
  }
  EXPECT_DOUBLE_EQ(gemm, 24.0 * 1024 * 1024);      // 24 h^2 per token
  EXPECT_DOUBLE_EQ(attention, 4.0 * 2048 * 1024);  // 4 s h per token
}

TEST(LayerGraph, ParametersAddUpToTheModel) {
  ModelSpec m = gpt(3, 256, 8, 0.0);
  m.position = PositionKind::kLearned;
  TrainingSpec t;
  LayerGraph g = build_layer_graph(m, t);
  double total = 3 * sum_params(g.layer) + sum_params(g.embedding) + sum_params(g.head);
  EXPECT_DOUBLE_EQ(total, static_cast<double>(m.total_params()));
}

TEST(LayerGraph, GroupedQueryAttentionShrinksQkv) {
  ModelSpec m = gpt(1, 4096, 32, 0.0);
  m.kv_heads = 8;
  TrainingSpec t;
  LayerGraph g = build_layer_graph(m, t);
  const Op* qkv = nullptr;
  for (const auto& op : g.layer) {
    if (op.name == "attn.qkv") qkv = &op;
  }
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->out_features, 4096 + 2 * 8 * 128);
}

}  // namespace
}  // namespace dtrain::model
