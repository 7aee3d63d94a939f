// plan_job.h: the one rule for fitting a cluster to a job's ranks, and planning a job through it.
#include "dtrain/plan/plan_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "plan_test_support.h"

namespace dtrain::plan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using test_support::kRoot;
const std::string kDgx = kRoot + "/examples/clusters/dgx-a100-80g.toml";  // 8 GPUs, one NVLink domain, 8 rails
const std::string kPcie = kRoot + "/examples/clusters/pcie-a100.toml";    // 8 GPUs, no NVLink, 2 NICs
const std::string kCpu = kRoot + "/examples/clusters/local-cpu.toml";     // 4 ranks, 1 NIC, no nic_of_gpu
const std::string kTiny = kRoot + "/examples/models/tiny.toml";
const std::string kBig = kRoot + "/examples/models/llama3-8b.toml";

TEST(FitCluster, FullNodesChangeOnlyTheNodeCount) {
  topology::ClusterSpec dgx = topology::load_cluster(kDgx);
  topology::ClusterSpec fitted = fit_cluster(dgx, {3, 8});
  EXPECT_EQ(fitted.nodes, 3);
  fitted.nodes = dgx.nodes;
  EXPECT_EQ(topology::canonical_text(fitted), topology::canonical_text(dgx));
}

TEST(FitCluster, FewerRanksUseTheFirstGpusOfTheirNvlinkDomain) {
  topology::ClusterSpec dgx = topology::load_cluster(kDgx);
  topology::ClusterSpec six = fit_cluster(dgx, {2, 6});
  EXPECT_EQ(six.nodes, 2);
  EXPECT_EQ(six.node.gpus, 6);
  EXPECT_EQ(six.node.nvlink_domain, 6);  // GPUs 0-5 all sit in the node's one domain
  EXPECT_THAT(six.node.nic_of_gpu, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_EQ(six.node.nics, 8);
  EXPECT_EQ(fit_cluster(dgx, {1, 2}).node.nvlink_domain, 2);
}

TEST(FitCluster, ADomainThatDoesNotDivideTheRanksShrinksToTheGcd) {
  topology::ClusterSpec c = topology::load_cluster(kDgx);
  c.node.nvlink_domain = 4;                                 // two domains: GPUs 0-3, 4-7
  EXPECT_EQ(fit_cluster(c, {1, 6}).node.nvlink_domain, 2);  // a group of 3 (GPUs 3-5) would straddle them
  EXPECT_EQ(fit_cluster(c, {1, 4}).node.nvlink_domain, 4);
  EXPECT_EQ(fit_cluster(c, {1, 3}).node.nvlink_domain, 3);
  EXPECT_EQ(fit_cluster(topology::load_cluster(kPcie), {2, 6}).node.nvlink_domain, 1);
}

TEST(FitCluster, EachGpuKeepsItsNic) {
  // pcie-a100 names its rails: GPUs 0-3 on NIC 0, 4-7 on NIC 1.
  EXPECT_THAT(fit_cluster(topology::load_cluster(kPcie), {2, 6}).node.nic_of_gpu, ElementsAre(0, 0, 0, 0, 1, 1));
  // Without nic_of_gpu, the whole node's default mapping (GPU g -> NIC g * nics / gpus) is written out.
  topology::ClusterSpec c = topology::load_cluster(kDgx);
  c.node.nic_of_gpu.clear();
  c.node.nics = 4;
  EXPECT_THAT(fit_cluster(c, {2, 4}).node.nic_of_gpu, ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(fit_cluster(topology::load_cluster(kCpu), {1, 2}).node.nic_of_gpu, ElementsAre(0, 0));
}

TEST(FitCluster, FittingTwiceChangesNothing) {
  topology::ClusterSpec once = fit_cluster(topology::load_cluster(kPcie), {2, 6});
  EXPECT_EQ(topology::canonical_text(fit_cluster(once, {2, 6})), topology::canonical_text(once));
}

TEST(FitCluster, MoreRanksThanGpusOrAnEmptyShapeIsRefused) {
  topology::ClusterSpec cpu = topology::load_cluster(kCpu);
  try {
    fit_cluster(cpu, {1, 5}, "--cluster c.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_THAT(e.what(), HasSubstr("5 ranks per node, but --cluster c.toml describes nodes of 4 GPUs"));
  }
  EXPECT_THROW(fit_cluster(cpu, {0, 2}), Error);
  EXPECT_THROW(fit_cluster(cpu, {1, 0}), Error);
}

TEST(PlanJob, PlansForTheShapeOnTheFittedCluster) {
  model::ModelDescription tiny = model::load_model(kTiny);
  JobRequest r;
  r.shape = {2, 2};
  JobPlan p = plan_job(tiny, topology::load_cluster(kCpu), r);
  ASSERT_TRUE(p.plan.has_value());
  EXPECT_EQ(p.plan->inputs.nodes, 2);
  EXPECT_EQ(p.plan->inputs.gpus_per_node, 2);
  EXPECT_EQ(p.plan->config.world_size(), 4);
  EXPECT_EQ(p.plan->cluster.node.gpus, 2);
  EXPECT_EQ(p.job.options.gpus, 4);
  EXPECT_EQ(p.job.options.global_batch, tiny.training.global_batch);
  EXPECT_EQ(render_plan(*p.plan), render_plan(*plan_job(tiny, topology::load_cluster(kCpu), r).plan));
}

TEST(PlanJob, NothingFitsIsANoFeasiblePlanError) {
  JobRequest r;
  r.shape = {1, 2};
  try {
    plan_job(model::load_model(kBig), topology::load_cluster(kCpu), r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kNoFeasiblePlan);
    EXPECT_THAT(e.what(), HasSubstr("llama3-8b"));
  }
  JobPlan searched = search_job(prepare_job(model::load_model(kBig), topology::load_cluster(kCpu), r));
  EXPECT_FALSE(searched.plan.has_value());
  EXPECT_EQ(no_feasible_plan(searched).exit_code(), ExitCode::kNoFeasiblePlan);
}

}  // namespace
}  // namespace dtrain::plan
