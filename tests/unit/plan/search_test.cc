#include "dtrain/plan/search.h"

#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/plan_file.h"
#include "plan_test_support.h"

namespace dtrain::plan {
namespace {

using test_support::kRoot;

CostModel make(const std::string& model, const std::string& cluster, int gpus) {
  auto m = model::load_model(kRoot + "/examples/models/" + model);
  auto c = topology::load_cluster(kRoot + "/examples/clusters/" + cluster);
  c.nodes = std::max(1, gpus / c.node.gpus);
  return CostModel(m, c);
}

SearchOptions options(int gpus, std::int64_t batch) {
  SearchOptions o;
  o.gpus = gpus;
  o.global_batch = batch;
  return o;
}

TEST(Search, DeterministicToTheByte) {
  CostModel cm = make("gpt3-175b.toml", "dgx-a100-80g.toml", 1024);
  SearchResult a = search(cm, options(1024, 1536));
  SearchResult b = search(cm, options(1024, 1536));
  ASSERT_TRUE(a.best && b.best);
  EXPECT_EQ(a.best->config, b.best->config);
  EXPECT_EQ(render_plan(make_plan(*a.best, cm, {})), render_plan(make_plan(*b.best, cm, {})));
  EXPECT_EQ(a.candidates, b.candidates);
  EXPECT_EQ(a.rejected, b.rejected);
}

TEST(Search, BestIsNoWorseThanEveryAlternativeAndAlternativesAreSorted) {
  CostModel cm = make("gpt3-175b.toml", "dgx-a100-80g.toml", 1024);
  SearchResult r = search(cm, options(1024, 1536));
  ASSERT_TRUE(r.best);
  ASSERT_EQ(r.alternatives.size(), 10u);
  double previous = r.best->iteration_s;
  for (const auto& a : r.alternatives) {
    EXPECT_GE(a.iteration_s, previous);
    EXPECT_NE(a.config, r.best->config);
    EXPECT_TRUE(a.feasible);
    previous = a.iteration_s;
  }
  for (const auto& [tp, e] : r.best_per_tp) EXPECT_GE(e.iteration_s, r.best->iteration_s);
  EXPECT_GT(r.rejected.at("memory"), 0);
  std::int64_t rejected = 0;
  for (const auto& [k, v] : r.rejected) rejected += v;
  EXPECT_EQ(r.candidates, r.evaluated + rejected);
}

TEST(Search, EveryDimensionPinnedEvaluatesExactlyThatLayout) {
  CostModel cm = make("gpt3-175b.toml", "dgx-a100-80g.toml", 1024);
  SearchOptions o = options(1024, 1536);
  o.fixed = parse_fixed(
      "tp=8,pp=8,dp=16,vpp=1,micro_batch=1,recompute=full,sequence_parallel=false,"
      "distributed_optimizer=false,schedule=1f1b,placement=tp-dp-pp");
  SearchResult r = search(cm, o);
  ASSERT_TRUE(r.best);
  EXPECT_EQ(r.evaluated, 1);
  EXPECT_EQ(r.candidates, 1);
  EXPECT_EQ(r.best->config.tp, 8);
  EXPECT_EQ(r.best->config.recompute, Recompute::kFull);
  EXPECT_DOUBLE_EQ(r.best->iteration_s, cm.evaluate(r.best->config, 1536).iteration_s);
}

TEST(Search, PinnedDimensionsAreRespected) {
  CostModel cm = make("llama3-70b.toml", "dgx-h100.toml", 256);
  SearchOptions o = options(256, 512);
  o.fixed = parse_fixed("tp=4,recompute=selective");
  SearchResult r = search(cm, o);
  ASSERT_TRUE(r.best);
  EXPECT_EQ(r.best->config.tp, 4);
  EXPECT_EQ(r.best->config.recompute, Recompute::kSelective);
  for (const auto& a : r.alternatives) EXPECT_EQ(a.config.tp, 4);
}

TEST(Search, NothingFitsReportsNearestMissesAndWhatWouldFit) {
  CostModel cm = make("megatron-1t.toml", "dgx-a100-80g.toml", 64);
  SearchOptions o = options(64, 3072);
  SearchResult r = search(cm, o);
  EXPECT_FALSE(r.best);
  ASSERT_FALSE(r.nearest_misses.empty());
  for (const auto& m : r.nearest_misses) EXPECT_GT(m.peak_memory_bytes, m.capacity_bytes);
  auto fit = minimum_gpus_that_fit(cm, o);
  ASSERT_TRUE(fit);
  EXPECT_GT(*fit, 64);
  SearchOptions bigger = o;
  bigger.gpus = *fit;
  EXPECT_TRUE(search(cm, bigger).best);
}

TEST(Search, PcieClusterAvoidsWideTensorParallelism) {
  CostModel cm = make("megatron-7.5b.toml", "pcie-a100.toml", 64);
  SearchResult r = search(cm, options(64, 512));
  ASSERT_TRUE(r.best);
  CostModel nv = make("megatron-7.5b.toml", "dgx-a100-80g.toml", 64);
  SearchResult r2 = search(nv, options(64, 512));
  ASSERT_TRUE(r2.best);
  EXPECT_LE(r.best->config.tp, r2.best->config.tp);
  EXPECT_LE(r.best->config.tp, 2);
}

TEST(Search, GlobalBatchTooSmallForTheGpusIsAnInputError) {
  CostModel cm = make("tiny.toml", "dgx-a100-80g.toml", 1024);
  SearchOptions o = options(1024, 2);
  o.global_batch_source = "tiny.toml:31: [training] global_batch = 2";
  try {
    search(cm, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("tiny.toml:31: [training] global_batch = 2: cannot be split over 1024 GPUs"),
              std::string::npos)
        << e.what();
  }
}

TEST(Search, TiesGoToLessMemory) {
  Estimate a, b;
  a.iteration_s = b.iteration_s = 1.0;
  a.peak_memory_bytes = 10;
  b.peak_memory_bytes = 20;
  EXPECT_TRUE(better(a, b));
  EXPECT_FALSE(better(b, a));
  b.iteration_s = 0.999;
  EXPECT_TRUE(better(b, a));
}

}  // namespace
}  // namespace dtrain::plan
