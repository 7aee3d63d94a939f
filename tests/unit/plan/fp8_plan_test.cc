// Planning with FP8 GEMMs ([training] fp8): the cost model's FP8 terms (the layers' GEMMs at the FP8 peak, the casts,
// the weight copies, the amax reductions by recipe), what explain says with and without it, Megatron's flags, and the
// model and cluster files' keys.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/cost_model.h"
#include "dtrain/plan/report.h"
#include "dtrain/plan/search.h"
#include "dtrain/topology/local_cpu.h"
#include "plan_test_support.h"

namespace dtrain::plan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using test_support::explained;
using test_support::kRoot;

model::ModelDescription llama8b(model::Fp8Format fp8, model::Fp8Recipe recipe = model::Fp8Recipe::kDelayed) {
  auto m = model::load_model(kRoot + "/examples/models/llama3-8b.toml");
  m.training.fp8 = fp8;
  m.training.fp8_recipe = recipe;
  return m;
}

topology::ClusterSpec cluster(const std::string& name) {
  return topology::load_cluster(kRoot + "/examples/clusters/" + name);
}

ParallelConfig layout(int tp, int pp, int dp, bool sp) {
  ParallelConfig c;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.sequence_parallel = sp;
  c.distributed_optimizer = dp > 1;
  return c;
}

TEST(Fp8Plan, TheLayersGemmsRunAtTheFp8PeakAndTheOutputLayerAndRouterDoNot) {
  const CostModel bf16(llama8b(model::Fp8Format::kNone), cluster("dgx-h100.toml"));
  const CostModel fp8(llama8b(model::Fp8Format::kHybrid), cluster("dgx-h100.toml"));
  const ParallelConfig c = fp8.complete(layout(2, 1, 4, true), 512);
  int linear = 0;
  for (const auto& op : fp8.graph().layer) {
    if (op.kind != model::OpKind::kLinear) continue;
    ++linear;
    ASSERT_TRUE(fp8.fp8_gemm(op)) << op.name;
    EXPECT_FALSE(bf16.fp8_gemm(op)) << op.name;
    // The GEMM alone: at 2 x 0.8 of the bf16 rate where compute-bound (these are large).
    EXPECT_NEAR(bf16.op_weight_grad_seconds(op, c) / fp8.op_weight_grad_seconds(op, c), 1.6, 0.05) << op.name;
    // The forward adds the input's cast, the backward the output gradient's.
    EXPECT_GT(fp8.op_forward_seconds(op, c), fp8.op_weight_grad_seconds(op, c)) << op.name;
    EXPECT_GT(fp8.op_backward_seconds(op, c), 2 * fp8.op_weight_grad_seconds(op, c)) << op.name;
    EXPECT_LT(fp8.op_forward_seconds(op, c), bf16.op_forward_seconds(op, c)) << op.name;
  }
  EXPECT_EQ(linear, 4);  // qkv, proj, fc1, fc2
  for (const auto& op : fp8.graph().head) EXPECT_FALSE(fp8.fp8_gemm(op)) << op.name;
  for (const auto& op : fp8.graph().layer) {
    if (op.kind == model::OpKind::kAttention) {
      EXPECT_EQ(fp8.op_forward_seconds(op, c), bf16.op_forward_seconds(op, c));
    }
  }
}

TEST(Fp8Plan, TheStepIsFasterAndTheWeightCopiesAreCounted) {
  const CostModel bf16(llama8b(model::Fp8Format::kNone), cluster("dgx-h100.toml"));
  const CostModel fp8(llama8b(model::Fp8Format::kHybrid), cluster("dgx-h100.toml"));
  const ParallelConfig c = layout(2, 2, 2, true);
  const Estimate a = bf16.evaluate(c, 512), b = fp8.evaluate(c, 512);
  EXPECT_LT(b.iteration_s, 0.9 * a.iteration_s);
  EXPECT_GT(b.iteration_s, 0.5 * a.iteration_s);
  // Two FP8 bytes (row-wise and transposed) per parameter of the stage's linear layers: the stage's parameters less
  // the norms (and the embedding on stage 0).
  const double copies = b.stages[1].weights_bytes - a.stages[1].weights_bytes;
  EXPECT_EQ(copies, 2.0 * fp8.fp8_weight_params(b.config, 1));
  const auto& m = fp8.model().model;
  const double linear_per_layer =
      static_cast<double>(m.hidden) * m.qkv_columns() + static_cast<double>(m.hidden) * m.hidden +
      static_cast<double>(m.hidden) * m.fc1_columns() + static_cast<double>(m.ffn_hidden) * m.hidden;
  EXPECT_NEAR(fp8.fp8_weight_params(b.config, 1), 16 * linear_per_layer / 2, 1.0);
  EXPECT_EQ(a.stages[1].gradients_bytes, b.stages[1].gradients_bytes);
  EXPECT_EQ(a.stages[1].optimizer_bytes, b.stages[1].optimizer_bytes);
}

TEST(Fp8Plan, DelayedScalingReducesAmaxesOncePerStepTensorwiseOverTpPerPass) {
  const CostModel delayed(llama8b(model::Fp8Format::kHybrid), cluster("dgx-h100.toml"));
  const CostModel tensorwise(llama8b(model::Fp8Format::kHybrid, model::Fp8Recipe::kTensorwise),
                             cluster("dgx-h100.toml"));
  const ParallelConfig sp = delayed.complete(layout(2, 1, 4, true), 512);
  EXPECT_GT(delayed.fp8_step_seconds(sp, 0), tensorwise.fp8_step_seconds(sp, 0));  // + the amax all-reduce
  EXPECT_EQ(delayed.fp8_amax_tp_seconds(sp), 0.0);
  EXPECT_GT(tensorwise.fp8_amax_tp_seconds(sp), 0.0);
  EXPECT_EQ(tensorwise.fp8_amax_tp_seconds(delayed.complete(layout(2, 1, 4, false), 512)), 0.0);
  EXPECT_GT(tensorwise.layer_tp_forward_seconds(sp) - tensorwise.fp8_amax_tp_seconds(sp), 0.0);
}

TEST(Fp8Plan, AGpuWithoutFp8IsRefusedNamingTheKey) {
  try {
    CostModel(llama8b(model::Fp8Format::kHybrid), cluster("dgx-a100-80g.toml"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_THAT(e.what(), HasSubstr("[training] fp8 = \"hybrid\": the GPU A100-SXM4-80GB"));
    EXPECT_THAT(e.what(), HasSubstr("has no FP8 tensor cores"));
  }
  // The CPU emulates them at its fp32 rate: the local cluster plans FP8 at the same GEMM time.
  const auto cpu = topology::local_cpu_cluster(2);
  auto tiny = model::load_model(kRoot + "/examples/models/tiny.toml");
  tiny.training.dtype = DType::kBf16;
  const CostModel plain(tiny, cpu);
  tiny.training.fp8 = model::Fp8Format::kHybrid;
  const CostModel fp8(tiny, cpu);
  const auto& op =
      fp8.graph().layer.front().kind == model::OpKind::kLinear ? fp8.graph().layer.front() : fp8.graph().layer[1];
  ASSERT_EQ(op.kind, model::OpKind::kLinear);
  const ParallelConfig c = fp8.complete(layout(1, 1, 1, false), 16);
  EXPECT_DOUBLE_EQ(fp8.op_weight_grad_seconds(op, c), plain.op_weight_grad_seconds(op, c));
}

TEST(Fp8Plan, ExplainSaysWhatFp8ChangesAndMegatronGetsItsFlags) {
  const CostModel bf16(llama8b(model::Fp8Format::kNone), cluster("dgx-h100.toml"));
  const std::string off = explain_text(explained(bf16, 64));
  EXPECT_THAT(off, HasSubstr("FP8 GEMMs (not used; the GPU has them)"));
  EXPECT_THAT(off, HasSubstr("with [training] fp8 = \"hybrid\" this layout would take"));
  const auto off_json = explain_json(explained(bf16, 64));
  ASSERT_TRUE(off_json.contains("fp8"));
  EXPECT_FALSE(off_json["fp8"]["used"].get<bool>());
  EXPECT_LT(off_json["fp8"]["iteration_s_fp8"].get<double>(), off_json["fp8"]["iteration_s_bf16"].get<double>());

  const CostModel fp8(llama8b(model::Fp8Format::kHybrid, model::Fp8Recipe::kTensorwise), cluster("dgx-h100.toml"));
  const Explanation e = explained(fp8, 64);
  const std::string on = explain_text(e);
  EXPECT_THAT(on, HasSubstr("seq 8192, bf16 with FP8 GEMMs (hybrid, tensorwise)"));
  EXPECT_THAT(on, HasSubstr("FP8 GEMMs (hybrid: E4M3 forward, E5M2 gradients; tensorwise scaling"));
  EXPECT_THAT(on, HasSubstr("without them (fp8 = \"none\") this layout would take"));
  EXPECT_THAT(megatron_args(fp8, e.chosen.config),
              HasSubstr("--bf16 \\\n  --fp8-format hybrid --fp8-recipe tensorwise"));
  EXPECT_THAT(megatron_args(bf16, e.chosen.config), Not(HasSubstr("--fp8")));

  // Nothing to say on a GPU without FP8.
  const CostModel a100(llama8b(model::Fp8Format::kNone), cluster("dgx-a100-80g.toml"));
  EXPECT_THAT(explain_text(explained(a100, 64)), Not(HasSubstr("FP8")));
}

TEST(Fp8Plan, TheKeysRoundTripThroughPlanFilesAndOnlyThenChangeTheDigest) {
  const auto plain = llama8b(model::Fp8Format::kNone);
  EXPECT_THAT(model::canonical_text(plain), Not(HasSubstr("fp8")));
  auto text = model::model_toml(llama8b(model::Fp8Format::kE4M3, model::Fp8Recipe::kTensorwise), "");
  EXPECT_THAT(text, HasSubstr("fp8 = \"e4m3\"\nfp8_recipe = \"tensorwise\"\n"));
  const auto back = model::parse_model(TomlDocument::parse_string(text, "m.toml"));
  EXPECT_EQ(back.training.fp8, model::Fp8Format::kE4M3);
  EXPECT_EQ(back.training.fp8_recipe, model::Fp8Recipe::kTensorwise);
  EXPECT_NE(back.digest, model::parse_model(TomlDocument::parse_string(model::model_toml(plain, ""), "m.toml")).digest);
}

}  // namespace
}  // namespace dtrain::plan
