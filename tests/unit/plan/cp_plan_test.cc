// Planning with context parallelism (ParallelConfig::cp): the tokens and activations each rank holds (1/cp of each
// sequence), the key/value exchanges priced three ways (p2p ring, all-gather, all-to-all), the search that weighs cp
// (Llama 3 405B at 131,072 tokens on 1,024 H100s fits only with it; 70B at 131,072 on 256 H100s is cheaper with it),
// explain's lines for it, Megatron's flags, the --fix, plan-file and JSON keys, and the requests it refuses.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/cost_model.h"
#include "dtrain/plan/placement.h"
#include "dtrain/plan/plan_file.h"
#include "dtrain/plan/report.h"
#include "dtrain/plan/search.h"
#include "plan_test_support.h"

namespace dtrain::plan {
namespace {

using ::testing::HasSubstr;

using test_support::explained;
using test_support::kRoot;

// An example model at a longer sequence (`seq_len` tokens, `batch` sequences per step) on the DGX-H100 cluster.
CostModel long_context(const std::string& model, std::int64_t seq_len, std::int64_t batch) {
  model::ModelDescription m = model::load_model(kRoot + "/examples/models/" + model);
  m.model.seq_len = seq_len;
  m.training.global_batch = batch;
  return CostModel(m, topology::load_cluster(kRoot + "/examples/clusters/dgx-h100.toml"));
}

ParallelConfig cp_layout(int tp, int cp, int dp, CpComm comm) {
  ParallelConfig c;
  c.tp = tp;
  c.cp = cp;
  c.dp = dp;
  c.cp_comm = comm;
  c.sequence_parallel = tp > 1;
  c.distributed_optimizer = true;
  return c;
}

TEST(CpPlan, EachRankHoldsItsChunksTokensAndActivations) {
  const CostModel cm = long_context("llama3-8b.toml", 32768, 64);
  const ParallelConfig one = cm.complete(cp_layout(1, 1, 8, CpComm::kAllGather), 64);
  const ParallelConfig two = cm.complete(cp_layout(1, 2, 4, CpComm::kAllGather), 64);
  EXPECT_EQ(two.world_size(), 8);
  EXPECT_DOUBLE_EQ(cm.local_tokens(two), 16384);
  EXPECT_DOUBLE_EQ(cm.stage_memory(two, 0).activations_bytes, cm.stage_memory(one, 0).activations_bytes / 2);
  // Gradients reduced and optimizer state sharded over dp x cp = 8 ranks either way.
  EXPECT_DOUBLE_EQ(cm.stage_memory(two, 0).optimizer_bytes, cm.stage_memory(one, 0).optimizer_bytes);
  EXPECT_EQ(cm.dp_group(two).size, 8);
  EXPECT_EQ(cm.cp_group(two).size, 2);
  // Half the tokens, and each rank half of the causal attention: a micro-batch's passes take about half as long.
  const StageTimes a = cm.stage_pass_times(one, cm.layer_costs(one), 0);
  const StageTimes b = cm.stage_pass_times(two, cm.layer_costs(two), 0);
  EXPECT_NEAR(b.forward_s - b.cp_comm_s, a.forward_s / 2, 0.1 * a.forward_s);
  EXPECT_GT(b.cp_comm_s, 0);
}

TEST(CpPlan, TheThreeExchangesArePricedApart) {
  const CostModel cm = long_context("llama3-70b.toml", 131072, 32);
  const ParallelConfig p2p = cm.complete(cp_layout(8, 8, 4, CpComm::kP2p), 32);
  const ParallelConfig ag = cm.complete(cp_layout(8, 8, 4, CpComm::kAllGather), 32);
  // The ring hides each step behind 1/cp of the attention; at 131,072 tokens the attention is long enough to hide it.
  const double attention = 1.0;  // seconds of attention: more than any exchange here
  EXPECT_EQ(cm.cp_forward_seconds(p2p, attention), 0);
  EXPECT_GT(cm.cp_forward_seconds(ag, attention), 0);
  // The all-gather's backward gathers again and reduce-scatters the gradients: twice the forward's.
  EXPECT_NEAR(cm.cp_backward_seconds(ag, attention), 2 * cm.cp_forward_seconds(ag, attention), 1e-12);
  // With no attention to hide behind, the ring's cp - 1 steps are all exposed.
  EXPECT_GT(cm.cp_forward_seconds(p2p, 0), 0);
  EXPECT_DOUBLE_EQ(cm.cp_kv_bytes(p2p), 131072.0 / 8 * 2 * 1 * 128 * 2);    // tokens x (k, v) x kv heads/tp x d x bf16
  EXPECT_DOUBLE_EQ(cm.cp_transient_bytes(ag), 2 * 8 * cm.cp_kv_bytes(ag));  // the whole K/V and their gradients
  // The ring's backward: four blocks (held, arriving, gradient sums sent and received), this rank's part of the
  // gradients in fp32 (two bf16 blocks) and the queries' gradients in fp32 (8 heads x fp32 = 8 blocks of one K/V head).
  EXPECT_DOUBLE_EQ(cm.cp_transient_bytes(p2p), (4 + 2 + 8) * cm.cp_kv_bytes(p2p));
}

TEST(CpPlan, Llama405BAt128kFitsOnlyWithContextParallelism) {
  const CostModel cm = long_context("llama3-405b.toml", 131072, 128);
  SearchOptions o;
  o.gpus = 1024;
  o.global_batch = 128;
  const SearchResult r = search(cm, o);
  ASSERT_TRUE(r.best.has_value());
  EXPECT_GT(r.best->config.cp, 1);
  EXPECT_NE(r.best->config.cp_comm, CpComm::kA2a);  // what dtexec runs; a2a is priced and explained
  EXPECT_TRUE(r.best_per_cp_comm.count("p2p") > 0);
  EXPECT_TRUE(r.best_per_cp_comm.count("all_gather") > 0);
  o.fixed = parse_fixed("cp=1");
  const SearchResult none = search(cm, o);
  EXPECT_FALSE(none.best.has_value());
  EXPECT_FALSE(none.nearest_misses.empty());
}

TEST(CpPlan, ExplainSaysWhatContextParallelismBuysLlama70BAt128k) {
  const CostModel cm = long_context("llama3-70b.toml", 131072, 32);
  const Explanation e = explained(cm, 256);
  const std::string text = explain_text(e);
  EXPECT_GT(e.chosen.config.cp, 1);
  EXPECT_THAT(text, HasSubstr("context parallel     cp = "));
  EXPECT_THAT(text, HasSubstr("cp=1 instead: +"));
  EXPECT_THAT(text, HasSubstr("context-parallel K/V exchange (exposed)"));
  const Explanation without = explained(cm, 256, "cp=1");
  EXPECT_GT(without.chosen.iteration_s, e.chosen.iteration_s * 1.05);
  // At 131,072 tokens the ring hides behind the attention, which the all-gather cannot: the ring is chosen, the
  // all-gather priced beside it; the all-to-all, whose cp must divide the 8 key/value heads, needs full
  // recomputation to fit and is far behind.
  EXPECT_EQ(e.chosen.config.cp_comm, CpComm::kP2p);
  EXPECT_THAT(text, HasSubstr("K/V passed around a ring, overlapped with the attention"));
  EXPECT_THAT(text, HasSubstr("cp_comm=all_gather instead: +"));
  EXPECT_THAT(text, HasSubstr("cp_comm=a2a instead: +"));
  EXPECT_THAT(text, HasSubstr("cp=8 cp_comm=a2a"));
  EXPECT_THAT(text, Not(HasSubstr("priced only")));
  const std::string megatron = megatron_args(cm, e.chosen.config);
  EXPECT_THAT(megatron, HasSubstr(fmt::format("--context-parallel-size {} --cp-comm-type p2p", e.chosen.config.cp)));
  const nlohmann::json j = explain_json(e);
  EXPECT_EQ(j["config"]["cp"], e.chosen.config.cp);
  EXPECT_EQ(j["config"]["cp_comm"], "p2p");
  EXPECT_TRUE(j.contains("best_per_cp"));
  EXPECT_TRUE(j["best_per_cp_comm"].contains("all_gather"));
  EXPECT_TRUE(j["best_per_cp_comm"].contains("a2a"));
}

TEST(CpPlan, RanksAreOrderedTensorContextDataPipeline) {
  ParallelConfig c;
  c.tp = 2;
  c.cp = 2;
  c.dp = 2;
  c.pp = 2;
  const RankPlacement p = place_rank(c, 8, {}, 0, 6);  // tp 0, cp 1, dp 1, pp 0
  EXPECT_EQ(p.tp_rank, 0);
  EXPECT_EQ(p.cp_rank, 1);
  EXPECT_EQ(p.dp_rank, 1);
  EXPECT_EQ(p.pp_rank, 0);
  EXPECT_EQ(rank_of(c, 0, 0, 1, 1), 6);
  EXPECT_EQ(cp_group_ranks(c, 6), (std::vector<int>{4, 6}));
  EXPECT_EQ(dp_group_ranks(c, 6), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(tp_group_ranks(c, 6), (std::vector<int>{6, 7}));
  EXPECT_EQ(pp_group_ranks(c, 6), (std::vector<int>{6, 14}));
}

TEST(CpPlan, FixKeysAndThePlanFileCarryIt) {
  const FixedDims f = parse_fixed("cp=4,cp_comm=all_gather");
  EXPECT_EQ(*f.cp, 4);
  EXPECT_EQ(*f.cp_comm, CpComm::kAllGather);
  EXPECT_EQ(to_string(f), "cp=4,cp_comm=all_gather");
  EXPECT_THROW(parse_fixed("cp_comm=ring"), Error);
  try {
    parse_fixed("cp_com=p2p");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("did you mean 'cp_comm'"));
  }
  const CostModel cm(model::load_model(kRoot + "/examples/models/llama3-8b.toml"),
                     topology::load_cluster(kRoot + "/examples/clusters/dgx-h100.toml"));
  const Explanation e = explained(cm, 16, "cp=2,cp_comm=all_gather,tp=1,pp=1");
  const Plan plan = make_plan(e.chosen, cm, parse_fixed("cp=2,cp_comm=all_gather,tp=1,pp=1"));
  const std::string text = render_plan(plan);
  EXPECT_THAT(text, HasSubstr("cp = 2\ncp_comm = \"all_gather\"\n"));
  EXPECT_THAT(text, HasSubstr("cp_rank = [0, 1, 0, 1"));
  const Plan back = parse_plan(text, "plan.toml");
  EXPECT_EQ(back.config, plan.config);
  EXPECT_EQ(back.placement[1].cp_rank, 1);
  EXPECT_THAT(e.chosen.config.summary(), HasSubstr(" cp=2 cp_comm=all_gather"));
}

// Requests that cannot be: each refused with what to change.
TEST(CpPlan, ImpossibleRequestsAreRefused) {
  const CostModel cm = long_context("llama3-8b.toml", 8192, 64);
  auto refused = [&](const std::string& fix, const std::string& words) {
    SCOPED_TRACE(fix);
    SearchOptions o;
    o.gpus = 64;
    o.global_batch = 64;
    o.fixed = parse_fixed(fix);
    try {
      search(cm, o);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInput);
      EXPECT_THAT(e.what(), HasSubstr(words));
    }
  };
  // The sequence does not cut into 2 * cp chunks.
  refused("cp=3", "cp=3 needs seq_len=8192 divisible by 2*cp=6");
  // All-to-all re-splits heads: cp must divide each tensor-parallel rank's kv heads (8 / tp=4 = 2).
  refused("cp=4,cp_comm=a2a,tp=4", "needs cp to divide the heads (8) and key/value heads (2)");
  refused("cp=1,cp_comm=p2p", "with cp=1 there is none");
  refused("cp=16,tp=8,pp=1,dp=1", "tp*pp*dp*cp must divide");
  // A layout with cp pinned on the cost model directly.
  ParallelConfig c = cm.complete(cp_layout(1, 3, 2, CpComm::kAllGather), 64);
  EXPECT_THAT(cm.structural_problem(c, 64).value_or(""), HasSubstr("divisible by 2*cp=6"));
}

}  // namespace
}  // namespace dtrain::plan
