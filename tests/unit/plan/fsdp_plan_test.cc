// Planning with fully sharded data parallelism (ParallelConfig::fsdp): the memory it saves (parameters and gradients
// sharded, two units gathered), the collectives it adds (priced per micro-batch, hidden behind the passes where they
// can be), the search that weighs it (Llama 3 8B on 64 H100s, where experts run FSDP; Megatron's 1.7B, whose tied
// embeddings it holds whole), explain's line for it, Megatron-FSDP's flags, and the --fix, plan-file and JSON keys.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/cost_model.h"
#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/report.h"
#include "dtrain/plan/search.h"
#include "plan_test_support.h"

namespace dtrain::plan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using test_support::explained;
using test_support::kRoot;

CostModel fsdp_cost_model(const std::string& model, const std::string& cluster) {
  return CostModel(model::load_model(kRoot + "/examples/models/" + model),
                   topology::load_cluster(kRoot + "/examples/clusters/" + cluster));
}

ParallelConfig sharded_layout(int tp, int pp, int dp, bool fsdp) {
  ParallelConfig c;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.sequence_parallel = tp > 1;
  c.distributed_optimizer = true;
  c.fsdp = fsdp;
  return c;
}

TEST(FsdpPlan, WeightsAndGradientsAreShardedWithTwoUnitsGathered) {
  const CostModel cm = fsdp_cost_model("llama3-8b.toml", "dgx-h100.toml");
  const ParallelConfig dopt = cm.complete(sharded_layout(1, 1, 64, false), 512);
  const ParallelConfig fsdp = cm.complete(sharded_layout(1, 1, 64, true), 512);
  const StageMemory a = cm.stage_memory(dopt, 0), b = cm.stage_memory(fsdp, 0);
  EXPECT_EQ(a.params, b.params);
  // bf16 weights, fp32 gradients: 1/64 of the stage's plus the two largest units (the embedding, 525M parameters,
  // is the largest here) whole.
  const double unit = cm.fsdp_unit_params(fsdp, 0);
  EXPECT_NEAR(unit, 128256.0 * 4096, 1e6);
  EXPECT_NEAR(b.weights_bytes, (b.params / 64 + 2 * unit) * 2, 1e3);
  EXPECT_NEAR(b.gradients_bytes, (b.params / 64 + 2 * unit) * 4, 1e3);
  EXPECT_DOUBLE_EQ(b.optimizer_bytes, a.optimizer_bytes);  // sharded already by the distributed optimizer
  EXPECT_NEAR(a.weights_bytes, a.params * 2, 1e3);
  EXPECT_LT(b.total_bytes(), a.total_bytes() - 12 * kGiB);  // 8B x 6 bytes, less the gathered units
  EXPECT_DOUBLE_EQ(b.activations_bytes, a.activations_bytes);
}

TEST(FsdpPlan, TheCollectivesArePricedPerMicroBatchAndHiddenWhereTheyCanBe) {
  const CostModel cm = fsdp_cost_model("llama3-8b.toml", "dgx-h100.toml");
  const ParallelConfig dopt = cm.complete(sharded_layout(1, 1, 64, false), 512);
  const ParallelConfig fsdp = cm.complete(sharded_layout(1, 1, 64, true), 512);
  const Estimate a = cm.evaluate(dopt, 512), b = cm.evaluate(fsdp, 512);
  // Never faster than its distributed-optimizer twin: the same math and more communication ...
  EXPECT_GT(b.iteration_s, a.iteration_s * 0.999);
  EXPECT_DOUBLE_EQ(b.breakdown.compute_s, a.breakdown.compute_s);
  // ... but on NVLink plus 8 NICs per node most of it hides behind the passes: of the 8 micro-batches' 2 all-gathers
  // and 1 reduce-scatter of every layer, what is exposed is a few per cent of the step.
  const auto per_mb = cm.stage_pass_times(fsdp, cm.layer_costs(fsdp), 0);
  EXPECT_GT(per_mb.fsdp_comm_s, 0);
  EXPECT_NEAR(b.breakdown.dp_comm_s, fsdp.num_microbatches * per_mb.fsdp_comm_s, 1e-9);
  EXPECT_LT(b.breakdown.dp_comm_s, 0.05 * b.iteration_s);
  EXPECT_EQ(b.dp_reduce_s, 0);  // no bucket reduction after the last backward, no parameter all-gather after the step

  // Over PCIe and one slow NIC per node the same collectives outlast the passes and are exposed.
  const CostModel slow = fsdp_cost_model("llama3-8b.toml", "pcie-a100.toml");
  const ParallelConfig s = slow.complete(sharded_layout(1, 1, 64, true), 512);
  const Estimate e = slow.evaluate(s, 512);
  const Estimate twin = slow.evaluate(slow.complete(sharded_layout(1, 1, 64, false), 512), 512);
  EXPECT_GT(e.breakdown.dp_comm_s, 0.2 * e.iteration_s);
  EXPECT_GT(e.iteration_s, 1.2 * twin.iteration_s);
}

TEST(FsdpPlan, Llama3EightBOnSixtyFourH100sIsPlannedFullySharded) {
  // What the published recipes for 8B-class models run (TorchTitan, Megatron-FSDP): dp = 64 over all GPUs, no tensor
  // or pipeline parallelism, which fits only with the parameters and gradients sharded.
  const CostModel cm = fsdp_cost_model("llama3-8b.toml", "dgx-h100.toml");
  const Explanation e = explained(cm, 64);
  const ParallelConfig& c = e.chosen.config;
  EXPECT_TRUE(c.fsdp) << c.summary();
  EXPECT_TRUE(c.distributed_optimizer);
  EXPECT_EQ(c.dp, 64) << c.summary();
  EXPECT_NE(c.summary().find("dopt=on fsdp=on"), std::string::npos) << c.summary();
  const std::string text = explain_text(e);
  EXPECT_THAT(text, HasSubstr("distributed optimizer: on   fsdp: on"));
  EXPECT_THAT(text, HasSubstr("fsdp=off instead: +"));
  EXPECT_THAT(text, HasSubstr("memory: fsdp=off would be"));
  EXPECT_THAT(text, Not(HasSubstr("priced only")));
  const auto j = explain_json(e);
  EXPECT_TRUE(j["config"]["fsdp"].get<bool>());
  ASSERT_TRUE(j.contains("best_per_fsdp") && j["best_per_fsdp"].contains("off")) << j.dump();
  EXPECT_FALSE(j["best_per_fsdp"]["off"]["config"]["fsdp"].get<bool>());
  EXPECT_THAT(megatron_args(cm, c), HasSubstr("--use-distributed-optimizer \\\n  --use-megatron-fsdp "
                                              "--data-parallel-sharding-strategy optim_grads_params"));

  // Pinned off, the search does without it (slower: it needs a pipeline or tensor parallelism to fit).
  const Explanation off = explained(cm, 64, "fsdp=false");
  EXPECT_FALSE(off.chosen.config.fsdp);
  EXPECT_GT(off.chosen.iteration_s, e.chosen.iteration_s);
  EXPECT_THAT(megatron_args(cm, off.chosen.config), Not(HasSubstr("fsdp")));
}

TEST(FsdpPlan, FsdpWithTiedEmbeddingsIsChosenWhereItIsFaster) {
  // Megatron-LM 1.7B on 32 A100s: the distributed optimizer's parameter all-gather after the step is exposed, while
  // fsdp's gathers hide behind the passes; the model ties its embeddings, which fsdp holds whole beside its shards
  // (their gradients reduce-scattered and their slices gathered by the schedule, as the distributed optimizer's).
  const CostModel cm = fsdp_cost_model("megatron-1.7b.toml", "dgx-a100-80g.toml");
  const Explanation e = explained(cm, 32);
  ASSERT_TRUE(e.chosen.config.fsdp) << e.chosen.config.summary();
  ASSERT_EQ(e.search->best_per_fsdp.count(0), 1u);
  const Estimate& without = e.search->best_per_fsdp.at(0);
  EXPECT_FALSE(without.config.fsdp);
  EXPECT_LT(e.chosen.iteration_s, without.iteration_s);
  EXPECT_LT(e.chosen.breakdown.dp_comm_s, without.breakdown.dp_comm_s);
  const std::string text = explain_text(e);
  EXPECT_THAT(text, HasSubstr("fsdp=off instead: +"));
  EXPECT_THAT(text, Not(HasSubstr("priced only")));
  // The tied matrix (51,200 rows x 2,304 on each of the dp=32 GPUs at tp=1): whole, and its collectives in the
  // step's data-parallel time; the rest sharded.
  const ParallelConfig& c = e.chosen.config;
  ASSERT_EQ(c.pp, 1);
  const double vocab = 51200.0 * 2304;
  EXPECT_DOUBLE_EQ(cm.fsdp_whole_params(c, 0), vocab);
  EXPECT_GT(cm.fsdp_tied_seconds(c), 0);
  EXPECT_DOUBLE_EQ(cm.dp_reduce_seconds(c, cm.stage_params(c, 0)), cm.fsdp_tied_seconds(c));
  const StageMemory mem = cm.stage_memory(c, 0);
  const double params = cm.stage_params(c, 0);
  const double held = (params - vocab) / c.dp + vocab + 2 * cm.fsdp_unit_params(c, 0);
  const double bytes_per_gradient = mem.gradients_bytes / held;
  EXPECT_TRUE(bytes_per_gradient == 2 || bytes_per_gradient == 4) << bytes_per_gradient;
  ParallelConfig untied = c;
  untied.fsdp = false;
  EXPECT_EQ(cm.fsdp_whole_params(untied, 0), 0);
}

TEST(FsdpPlan, AFullyShardedLayoutThatRunsIsNotCalledPricedOnly) {
  // Mixtral 8x7B (untied) on 64 H100s: the best layout does without fsdp; the one with it is slower, and dtexec runs
  // it, so its line says what it costs and nothing about it being priced only.
  const CostModel cm = fsdp_cost_model("mixtral-8x7b.toml", "dgx-h100.toml");
  const Explanation e = explained(cm, 64);
  EXPECT_FALSE(e.chosen.config.fsdp) << e.chosen.config.summary();
  const std::string text = explain_text(e);
  EXPECT_THAT(text, HasSubstr("fsdp=on instead: +"));
  EXPECT_THAT(text, Not(HasSubstr("priced only")));
}

TEST(FsdpPlan, KeysAndRefusals) {
  const FixedDims f = parse_fixed("fsdp=on,tp=2");
  ASSERT_TRUE(f.fsdp);
  EXPECT_TRUE(*f.fsdp);
  EXPECT_EQ(to_string(f), "tp=2,fsdp=true");
  EXPECT_FALSE(parse_fixed("fsdp=off").fsdp.value());
  EXPECT_THROW(parse_fixed("fsdp=maybe"), Error);
  try {
    parse_fixed("fsd=true");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("did you mean 'fsdp'?"));
  }

  const CostModel cm = fsdp_cost_model("llama3-8b.toml", "dgx-h100.toml");
  ParallelConfig c = sharded_layout(1, 1, 64, true);
  c.distributed_optimizer = false;
  EXPECT_THAT(cm.structural_problem(c, 512).value_or(""), HasSubstr("fsdp needs the distributed optimizer"));
  SearchOptions o;
  o.gpus = 64;
  o.global_batch = 512;
  o.fixed = parse_fixed("fsdp=true,distributed_optimizer=false");
  try {
    search(cm, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("it needs distributed_optimizer=true"));
  }
  o.fixed = parse_fixed("fsdp=true,dp=1");
  EXPECT_THROW(search(cm, o), Error);
  // Pinned on where the distributed optimizer alone fits: every layout is fully sharded.
  o.fixed = parse_fixed("fsdp=true");
  const CostModel small = fsdp_cost_model("megatron-1.7b.toml", "dgx-a100-80g.toml");
  o.gpus = 32;
  o.global_batch = small.model().training.global_batch;
  const SearchResult r = search(small, o);
  ASSERT_TRUE(r.best);
  EXPECT_TRUE(r.best->config.fsdp);
  for (const auto& alt : r.alternatives) EXPECT_TRUE(alt.config.fsdp) << alt.config.summary();
}

TEST(FsdpPlan, ThePlanFileCarriesItOnlyWhenOn) {
  const CostModel cm = fsdp_cost_model("llama3-8b.toml", "dgx-h100.toml");
  const Explanation e = explained(cm, 64, "fsdp=true");
  const Plan p = make_plan(e.chosen, cm, e.options.fixed);
  const std::string text = render_plan(p);
  EXPECT_THAT(text, HasSubstr("\nfsdp = true\n"));
  const Plan back = parse_plan(text, "plan.toml");
  EXPECT_TRUE(back.config.fsdp);
  EXPECT_EQ(back.config, p.config);

  const Explanation off = explained(cm, 64, "fsdp=false");
  EXPECT_THAT(render_plan(make_plan(off.chosen, cm, off.options.fixed)), Not(HasSubstr("\nfsdp =")));
}

}  // namespace
}  // namespace dtrain::plan
