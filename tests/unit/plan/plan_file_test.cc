#include "dtrain/plan/plan_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "dtrain/common/error.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/search.h"
#include "plan_test_support.h"

namespace dtrain::plan {
namespace {

using ::testing::HasSubstr;

using test_support::kRoot;

struct Fixture {
  CostModel cm;
  Plan plan;
};

Fixture planned(const std::string& fix, const std::string& model = "gpt3-175b.toml") {
  auto m = model::load_model(kRoot + "/examples/models/" + model);
  auto c = topology::load_cluster(kRoot + "/examples/clusters/dgx-a100-80g.toml");
  c.nodes = 64;
  CostModel cm(m, c);
  SearchOptions o;
  o.gpus = 512;
  o.global_batch = 1536;
  o.global_batch_source = m.located("training.global_batch", "");
  o.fixed = parse_fixed(fix);
  SearchResult r = search(cm, o);
  EXPECT_TRUE(r.best);
  Plan p = make_plan(*r.best, cm, o.fixed);
  return {std::move(cm), std::move(p)};
}

TEST(PlanFile, RoundTripsAndKeepsItsDigest) {
  Fixture f = planned("tp=8,pp=8");
  std::string text = render_plan(f.plan);
  Plan back = parse_plan(text, "plan.toml");
  EXPECT_EQ(back.digest, f.plan.digest);
  EXPECT_EQ(back.config, f.plan.config);
  EXPECT_EQ(back.inputs.model_digest, f.cm.model().digest);
  EXPECT_EQ(back.inputs.gpus, 512);
  EXPECT_DOUBLE_EQ(back.predicted.iteration_s, f.plan.predicted.iteration_s);
  EXPECT_EQ(render_plan(back), text);
  ASSERT_EQ(back.placement.size(), 512u);
  for (std::size_t r = 0; r < back.placement.size(); ++r) {
    EXPECT_EQ(back.placement[r].nic, f.plan.placement[r].nic);
    EXPECT_EQ(back.placement[r].pp_rank, f.plan.placement[r].pp_rank);
  }
}

TEST(PlanFile, AnEditIsDetected) {
  Fixture f = planned("tp=8,pp=8");
  std::string text = render_plan(f.plan);
  auto pos = text.find("micro_batch = ");
  ASSERT_NE(pos, std::string::npos);
  std::string edited = text;
  edited.replace(pos, std::string("micro_batch = 1").size(), "micro_batch = 2");
  try {
    parse_plan(edited, "edited.toml");
    FAIL() << "edit not detected";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr("edited.toml: digest mismatch"));
    EXPECT_THAT(e.what(), HasSubstr("edited after dtplan wrote it"));
  }
}

TEST(PlanFile, TensorParallelGroupsStayInsideANodeAndRanksAreUnique) {
  Fixture f = planned("tp=8,pp=8");
  const ParallelConfig& c = f.plan.config;
  std::set<std::tuple<int, int, int>> coords;
  for (const auto& r : f.plan.placement) {
    coords.insert({r.tp_rank, r.pp_rank, r.dp_rank});
    EXPECT_EQ(rank_of(c, r.tp_rank, r.pp_rank, r.dp_rank), r.rank);
    for (int peer : tp_group_ranks(c, r.rank)) EXPECT_EQ(peer / 8, r.node);
    EXPECT_EQ(r.nic, r.gpu);  // DGX A100: one NIC per GPU (rail)
  }
  EXPECT_EQ(coords.size(), 512u);
}

TEST(PlanFile, PipelineNeighboursShareANodeWithTpPpDp) {
  Fixture f = planned("tp=2,pp=4,placement=tp-pp-dp", "megatron-7.5b.toml");
  const ParallelConfig& c = f.plan.config;
  ASSERT_EQ(c.placement, PlacementOrder::kTpPpDp);
  for (const auto& r : f.plan.placement) {
    for (int peer : pp_group_ranks(c, r.rank)) EXPECT_EQ(peer / 8, r.node);
  }
}

TEST(PlanFile, MissingFileAndWrongFormat) {
  EXPECT_THROW(load_plan("/nonexistent/plan.toml"), Error);
  try {
    parse_plan("format = 2\n", "p.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("p.toml:1: format = 2: unsupported format version"));
  }
}

}  // namespace
}  // namespace dtrain::plan
