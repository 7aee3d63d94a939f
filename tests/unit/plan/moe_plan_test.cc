// Planning a mixture of experts: the cost model's MoE terms (routed FLOPs, experts split over ep, the all-to-all by
// where the ep group lands, the imbalance factor), the search over ep with Megatron-Core's constraints, and the plan
// file carrying ep and etp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/common/error.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/cost_model.h"
#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/search.h"
#include "plan_test_support.h"

namespace dtrain::plan {
namespace {

using test_support::kRoot;

CostModel mixtral_on(int nodes, double imbalance = 1.0) {
  auto model = model::load_model(kRoot + "/examples/models/mixtral-8x7b.toml");
  auto cluster = topology::load_cluster(kRoot + "/examples/clusters/dgx-h100.toml");
  cluster.nodes = nodes;
  cluster.node.gpu.calibration.moe_imbalance = imbalance;
  return CostModel(model, cluster);
}

ParallelConfig moe_layout(int tp, int pp, int dp, int ep, int mb) {
  ParallelConfig c;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.ep = ep;
  c.micro_batch = mb;
  return c;
}

TEST(MoePlan, ExpertsSplitOverEpAndTheirAllToAllIsPriced) {
  CostModel cm = mixtral_on(8);
  const std::int64_t batch = cm.model().training.global_batch;
  Estimate ep1 = cm.evaluate(moe_layout(1, 4, 16, 1, 1), batch);
  Estimate ep8 = cm.evaluate(moe_layout(1, 4, 16, 8, 1), batch);
  EXPECT_EQ(ep1.config.etp, 1);  // completed: etp = tp for an MoE model
  // Each rank holds 1/8 of the experts: the stage's parameters drop by 7/8 of its experts'.
  const auto& m = cm.model().model;
  const double experts_per_layer = static_cast<double>(m.moe.experts) * 3.0 * m.hidden * m.moe.ffn_hidden;
  EXPECT_NEAR(ep1.stages[0].params - ep8.stages[0].params, 8 * experts_per_layer * 7.0 / 8.0,
              1e-6 * ep1.stages[0].params);
  EXPECT_EQ(ep1.breakdown.ep_comm_s, 0.0);
  EXPECT_GT(ep8.breakdown.ep_comm_s, 0.0);
  // Inside one node (tp 1 x ep 8 = 8 GPUs) the all-to-all is on NVLink; ep 16 reaches a second node and costs more
  // per byte.
  const GroupGeometry in_node = cm.ep_group(moe_layout(1, 4, 16, 8, 1));
  EXPECT_EQ(in_node.nodes, 1);
  EXPECT_TRUE(in_node.nvlink);
  const double bytes = 1e8;
  EXPECT_GT(cm.all_to_all_seconds(bytes, cm.ep_group(moe_layout(1, 2, 32, 16, 1))) / 16 * 15,
            cm.all_to_all_seconds(bytes, in_node) / 8 * 7);
  // The imbalance factor slows the busiest rank's experts and exchange.
  Estimate skewed = mixtral_on(8, 1.3).evaluate(moe_layout(1, 4, 16, 8, 1), batch);
  EXPECT_GT(skewed.iteration_s, ep8.iteration_s);
  // (Not quite 1.3 times: latencies stay, and bandwidth efficiency grows with the message.)
  EXPECT_GT(skewed.breakdown.ep_comm_s, 1.1 * ep8.breakdown.ep_comm_s);
  EXPECT_LT(skewed.breakdown.ep_comm_s, 1.3 * ep8.breakdown.ep_comm_s);
}

// A calibrated GPU's grouped GEMMs run below the plain GEMM curve: every expert GEMM (and only those) slows by the
// measured factor; the figure is written and read back only when it is not 1.
TEST(MoePlan, TheExpertsGroupedGemmsTakeTheirMeasuredRate) {
  auto model = model::load_model(kRoot + "/examples/models/mixtral-8x7b.toml");
  auto cluster = topology::load_cluster(kRoot + "/examples/clusters/dgx-h100.toml");
  const std::string digest_before = topology::canonical_text(cluster);
  const CostModel plain(model, cluster);
  cluster.node.gpu.calibration.expert_gemm_efficiency = 0.5;
  const CostModel grouped(model, cluster);
  const ParallelConfig c = moe_layout(2, 4, 4, 2, 1);
  int experts = 0;
  for (const auto& op : grouped.graph().moe_layer) {
    const double ratio = grouped.op_forward_seconds(op, c) / plain.op_forward_seconds(op, c);
    if (op.experts > 0) {
      EXPECT_DOUBLE_EQ(ratio, 2.0) << op.name;
      EXPECT_DOUBLE_EQ(grouped.op_weight_grad_seconds(op, c), 2.0 * plain.op_weight_grad_seconds(op, c)) << op.name;
      ++experts;
    } else {
      EXPECT_DOUBLE_EQ(ratio, 1.0) << op.name;
    }
  }
  EXPECT_EQ(experts, 2);  // fc1 and fc2
  EXPECT_EQ(digest_before.find("expert_gemm_efficiency"), std::string::npos);
  const std::string text = topology::cluster_toml(cluster, "");
  EXPECT_EQ(topology::parse_cluster(TomlDocument::parse_string(text, "c.toml")).calibration().expert_gemm_efficiency,
            0.5);
  std::string bad = text;
  bad.replace(bad.find("expert_gemm_efficiency = 0.5"), 28, "expert_gemm_efficiency = 1.5");
  EXPECT_THROW(topology::parse_cluster(TomlDocument::parse_string(bad, "c.toml")), Error);
}

TEST(MoePlan, RoutedFlopsAreTopKOfTheExperts) {
  // A layer's expert GEMMs take the time of top_k dense MLPs of the experts' width (balanced), not of every expert.
  CostModel cm = mixtral_on(1);
  const auto& g = cm.graph();
  ASSERT_FALSE(g.moe_layer.empty());
  double routed = 0;
  for (const auto& op : g.moe_layer) {
    if (op.experts > 0) routed += op.flops_per_token;
  }
  const auto& m = cm.model().model;
  EXPECT_DOUBLE_EQ(routed, 2.0 * m.moe.top_k * 3.0 * m.hidden * m.moe.ffn_hidden);
}

TEST(MoePlan, SearchPicksAnEpThatDividesDpAndTheExperts) {
  CostModel cm = mixtral_on(8);
  SearchOptions o;
  o.gpus = 64;
  o.global_batch = cm.model().training.global_batch;
  SearchResult r = search(cm, o);
  ASSERT_TRUE(r.best);
  const ParallelConfig& c = r.best->config;
  EXPECT_EQ(c.dp % c.ep, 0);
  EXPECT_EQ(cm.model().model.moe.experts % c.ep, 0);
  EXPECT_EQ(c.etp, c.tp);
  EXPECT_GE(r.best_per_ep.size(), 2u);  // the why-lines have other ep values to compare
  o.fixed.ep = 2;
  SearchResult pinned = search(cm, o);
  ASSERT_TRUE(pinned.best);
  EXPECT_EQ(pinned.best->config.ep, 2);
  o.fixed.ep = 3;
  EXPECT_THROW(search(cm, o), Error);  // 3 does not divide 8 experts
}

// With the distributed optimizer and ep > 1 the experts' optimizer state is split over the dp / ep ranks holding the
// same experts, the rest over dp; the experts' gradients travel over that smaller group.
TEST(MoePlan, TheDistributedOptimizerShardsExpertStateOverTheirDataParallelRanks) {
  CostModel cm = mixtral_on(8);
  const std::int64_t batch = cm.model().training.global_batch;
  ParallelConfig c = moe_layout(1, 4, 16, 8, 1);
  c.distributed_optimizer = true;
  ASSERT_FALSE(cm.structural_problem(c, batch)) << *cm.structural_problem(c, batch);
  const Estimate sharded = cm.evaluate(c, batch);
  c.distributed_optimizer = false;
  const Estimate whole = cm.evaluate(c, batch);
  const StageMemory& s = sharded.stages[1];  // a stage of MoE layers only, no embedding or head
  const double experts = cm.stage_expert_params(sharded.config, 1);
  ASSERT_GT(experts, 0.5 * s.params);
  // Per GPU: the dense part's state / 16, the experts' / (16 / 8).
  const double state = whole.stages[1].optimizer_bytes / s.params;  // bytes per parameter, unsharded
  EXPECT_NEAR(s.optimizer_bytes, state * ((s.params - experts) / 16 + experts / 2), 1e-9 * s.optimizer_bytes);
  EXPECT_LT(s.optimizer_bytes, whole.stages[1].optimizer_bytes / 2);
  EXPECT_EQ(cm.optimizer_state_params(sharded.config, 100, 40), 60.0 / 16 + 40.0 * 8 / 16);
  // The expert data-parallel group: 2 ranks, 8 data-parallel ranks apart (so on another node).
  const GroupGeometry edp = cm.edp_group(sharded.config);
  EXPECT_EQ(edp.size, 2);
  EXPECT_EQ(edp.nodes, 2);
  // The experts' gradients add their reduction over that group to the rest's over dp. Each GPU of the pair sends half
  // of its experts' gradients over its NIC, where a 16-rank group of two nodes would send 1/16 of them across
  // (summed over NVLink first): the pair costs more per byte than pricing the experts with the dense part did.
  const double rest = cm.dp_reduce_seconds(sharded.config, s.params - experts);
  EXPECT_GT(cm.dp_reduce_seconds(sharded.config, s.params, experts), rest);
  EXPECT_GT(cm.dp_reduce_seconds(sharded.config, s.params, experts), cm.dp_reduce_seconds(sharded.config, s.params));
  // ep = dp: each expert on one rank, nothing to reduce or shard for it.
  ParallelConfig all = moe_layout(1, 4, 16, 16, 1);
  all.distributed_optimizer = true;
  EXPECT_THROW(cm.evaluate(all, batch), Error);  // 16 does not divide 8 experts
  ParallelConfig eight = moe_layout(1, 4, 8, 8, 1);
  eight.distributed_optimizer = true;
  const Estimate e8 = cm.evaluate(eight, batch);
  const double x8 = cm.stage_expert_params(e8.config, 1);
  EXPECT_NEAR(cm.dp_reduce_seconds(e8.config, e8.stages[1].params, x8),
              cm.dp_reduce_seconds(e8.config, e8.stages[1].params - x8), 1e-15);
  // The search considers the combination.
  SearchOptions o;
  o.gpus = 64;
  o.global_batch = batch;
  o.fixed.ep = 8;
  o.fixed.distributed_optimizer = true;
  SearchResult r = search(cm, o);
  ASSERT_TRUE(r.best);
  EXPECT_EQ(r.best->config.ep, 8);
  EXPECT_TRUE(r.best->config.distributed_optimizer);
}

// etp = 1 under tp > 1: the experts are whole on every tensor-parallel rank (tp times the expert weights of etp = tp),
// the MoE layer's tensor-parallel communication halves (the attention's remains), each rank routes tokens / tp;
// it needs sequence parallelism and whole sequences per rank.
TEST(MoePlan, WholeExpertsOnEachTensorParallelRank) {
  CostModel cm = mixtral_on(8);
  const std::int64_t batch = cm.model().training.global_batch;
  ParallelConfig c = moe_layout(2, 4, 8, 8, 2);
  c.sequence_parallel = true;
  c.etp = 2;
  const Estimate split = cm.evaluate(c, batch);
  c.etp = 1;
  ASSERT_FALSE(cm.structural_problem(c, batch)) << *cm.structural_problem(c, batch);
  const Estimate whole = cm.evaluate(c, batch);
  EXPECT_DOUBLE_EQ(cm.stage_expert_params(whole.config, 1), 2 * cm.stage_expert_params(split.config, 1));
  EXPECT_GT(whole.stages[1].params, split.stages[1].params);
  const LayerCosts a = cm.layer_costs(split.config), b = cm.layer_costs(whole.config);
  // The attention's all-gather of its saved input for the weight gradient stays; the rest halves, and there is no
  // router-gradient all-reduce either.
  const double regather = cm.regather_seconds(cm.graph().moe_layer, whole.config);
  EXPECT_GT(regather, 0);
  EXPECT_DOUBLE_EQ(regather, cm.regather_seconds(cm.graph().moe_layer, split.config));
  EXPECT_LT(b.moe_layer.tp_comm_s - regather, 0.5 * (a.moe_layer.tp_comm_s - regather));
  EXPECT_DOUBLE_EQ(b.layer.tp_comm_s, a.layer.tp_comm_s);   // dense layers as before
  EXPECT_LT(b.moe_layer.ep_comm_s, a.moe_layer.ep_comm_s);  // half the rows per rank
  c.sequence_parallel = false;
  EXPECT_EQ(cm.structural_problem(c, batch), "etp=1 with tp=2 needs sequence parallelism");
  c.sequence_parallel = true;
  c.micro_batch = 1;
  EXPECT_THAT(cm.structural_problem(c, batch).value_or(""), ::testing::HasSubstr("divisible by tp"));
  c.etp = 4;
  EXPECT_THAT(cm.structural_problem(c, batch).value_or(""), ::testing::HasSubstr("etp=4 with tp=2"));
}

TEST(MoePlan, ADenseModelKeepsEpOneAndRefusesIt) {
  auto model = model::load_model(kRoot + "/examples/models/llama3-8b.toml");
  auto cluster = topology::load_cluster(kRoot + "/examples/clusters/dgx-h100.toml");
  CostModel cm(model, cluster);
  SearchOptions o;
  o.gpus = 8;
  o.global_batch = 512;
  SearchResult r = search(cm, o);
  ASSERT_TRUE(r.best);
  EXPECT_EQ(r.best->config.ep, 1);
  EXPECT_EQ(r.best->config.etp, 0);
  EXPECT_TRUE(r.best_per_ep.empty());
  o.fixed.ep = 2;
  EXPECT_THROW(search(cm, o), Error);
}

TEST(MoePlan, ThePlanFileCarriesEpAndEtp) {
  CostModel cm = mixtral_on(8);
  Estimate e = cm.evaluate(moe_layout(2, 4, 8, 4, 1), cm.model().training.global_batch);
  Plan p = make_plan(e, cm, FixedDims{});
  const std::string text = render_plan(p);
  EXPECT_NE(text.find("ep = 4\netp = 2\n"), std::string::npos);
  Plan back = parse_plan(text, "plan.toml");
  EXPECT_EQ(back.config.ep, 4);
  EXPECT_EQ(back.config.etp, 2);
  EXPECT_EQ(back.digest, p.digest);
}

}  // namespace
}  // namespace dtrain::plan
