// The nodes an elastic job goes on with (dtrain/launch/membership.h), and --nnodes MIN:MAX.
#include "dtrain/launch/membership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "dtrain/launch/job_config.h"

namespace dtrain::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Membership, RanksAreRenumberedOverTheNodesLeft) {
  Membership m(4, 3, 2);
  EXPECT_EQ(m.world(), 8);
  EXPECT_EQ(m.first_rank_of(3), 6);
  std::string why;
  auto left = m.without({2}, why);
  ASSERT_TRUE(left) << why;
  EXPECT_THAT(*left, ElementsAre(0, 1, 3));
  m.shrink_to(*left);
  EXPECT_EQ(m.world(), 6);
  EXPECT_EQ(m.index_of(3), 2);
  EXPECT_EQ(m.first_rank_of(3), 4);  // node 3 now runs ranks 4 and 5
  EXPECT_EQ(m.node_of_rank(5), 3);
  EXPECT_FALSE(m.contains(2));
  EXPECT_EQ(m.index_of(2), -1);
}

TEST(Membership, NotBelowMinNorWithoutNodeZero) {
  Membership m(4, 3, 1);
  std::string why;
  EXPECT_FALSE(m.without({1, 2}, why));
  EXPECT_THAT(why, HasSubstr("2 of the job's nodes would be left, fewer than the 3 it needs"));
  EXPECT_FALSE(m.without({0}, why));
  EXPECT_THAT(why, HasSubstr("node 0 hosts the job's store"));
  EXPECT_FALSE(m.without({7}, why));
  EXPECT_THAT(why, HasSubstr("not one of the job's"));
}

TEST(Membership, NnodesTextIsNOrMinMax) {
  EXPECT_EQ(parse_nnodes("4"), std::make_pair(4, 4));
  EXPECT_EQ(parse_nnodes("3:4"), std::make_pair(3, 4));
  for (const char* bad : {"0", "4:3", "a", "3:", ":4", "0:2", "-1:2"}) {
    try {
      parse_nnodes(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
      EXPECT_THAT(e.what(), HasSubstr("--nnodes")) << bad;
    }
  }
}

TEST(Membership, ElasticJobByHandAndUnderSlurm) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"dtexec", "train"};
  o.nnodes = 4;
  o.min_nnodes = 3;
  o.node_rank = 1;
  o.rdzv = "10.0.0.1:29400";
  JobConfig j = resolve_job(o, {});
  EXPECT_TRUE(j.elastic());
  EXPECT_EQ(j.nnodes, 4);
  EXPECT_EQ(j.min_nnodes, 3);
  EXPECT_THAT(j.describe(), HasSubstr("going on with down to 3 nodes"));
  // Under Slurm, --nnodes MIN:MAX alone keeps Slurm's layout, whose node count must be MAX.
  LaunchOptions s;
  s.nproc_per_node = 2;
  s.command = {"dtexec", "train"};
  s.nnodes = 4;
  s.min_nnodes = 2;
  Environment env{{"SLURM_JOB_ID", "77"},
                  {"SLURM_STEP_ID", "0"},
                  {"SLURM_JOB_NODELIST", "n[1-4]"},
                  {"SLURM_STEP_NODELIST", "n[1-4]"},
                  {"SLURM_NNODES", "4"},
                  {"SLURM_STEP_NUM_NODES", "4"},
                  {"SLURM_NODEID", "2"},
                  {"SLURM_STEP_NUM_TASKS", "4"}};
  JobConfig sj = resolve_job(s, env);
  EXPECT_TRUE(sj.slurm);
  EXPECT_EQ(sj.node_rank, 2);
  EXPECT_EQ(sj.min_nnodes, 2);
  env["SLURM_STEP_NUM_NODES"] = "3";
  env["SLURM_STEP_NODELIST"] = "n[1-3]";
  env["SLURM_STEP_NUM_TASKS"] = "3";
  try {
    resolve_job(s, env);
    ADD_FAILURE() << "a step of 3 nodes for --nnodes 2:4 was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("an elastic job starts with MAX nodes"));
  }
}

}  // namespace
}  // namespace dtrain::launch
