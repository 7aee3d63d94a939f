#include "dtrain/spank/step_shape.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"

namespace dtrain::spank {
namespace {

using ::testing::HasSubstr;
using Argv = std::vector<std::string>;

TEST(StepShape, TaskPerRank) {
  StepShape s = step_shape(2, 8, {"dtexec", "train"});
  EXPECT_EQ(s.style, LaunchStyle::kTaskPerRank);
  EXPECT_EQ(s.ranks_per_node, 4);
  EXPECT_EQ(s.world_size(), 8);
  EXPECT_EQ(s.describe(), "2 nodes x 4 ranks (task per rank)");
  EXPECT_EQ(step_shape(1, 1, {"python3", "train.py"}).describe(), "1 node x 1 rank (task per rank)");
}

TEST(StepShape, UnevenTasksAreRefusedWithTheFix) {
  try {
    step_shape(2, 5, {"dtexec"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("5 tasks on 2 nodes"));
    EXPECT_THAT(e.what(), HasSubstr("--ntasks-per-node"));
  }
}

TEST(StepShape, DtlaunchIsDetectedFromTheCommand) {
  EXPECT_EQ(dtlaunch_ranks_per_node({"dtlaunch", "--nproc-per-node", "2", "--", "dtexec"}), 2);
  EXPECT_EQ(dtlaunch_ranks_per_node({"/opt/dtrain/bin/dtlaunch", "--max-restarts", "1", "--nproc=8", "--", "x"}), 8);
  EXPECT_EQ(dtlaunch_ranks_per_node({"env", "-i", "A=1", "B_2=x", "dtlaunch", "--nproc", "3", "--", "x"}), 3);
  EXPECT_EQ(dtlaunch_ranks_per_node({"dtexec", "train"}), std::nullopt);
  EXPECT_EQ(dtlaunch_ranks_per_node({"bash", "-c", "dtlaunch --nproc 2 -- x"}), std::nullopt);
  EXPECT_EQ(dtlaunch_ranks_per_node({}), std::nullopt);
  // the rank's command after -- is not dtlaunch's
  EXPECT_THROW(dtlaunch_ranks_per_node({"dtlaunch", "--", "x", "--nproc-per-node", "2"}), Error);
  EXPECT_THROW(dtlaunch_ranks_per_node({"dtlaunch", "--nproc-per-node", "zero", "--", "x"}), Error);
  // a count (dtrain/common/count.h): 0 is refused naming the option, not taken as "not dtlaunch"
  for (const char* bad : {"0", "-2"}) {
    try {
      dtlaunch_ranks_per_node({"dtlaunch", "--nproc", bad, "--", "x"});
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
      EXPECT_THAT(e.what(), HasSubstr(std::string("dtlaunch --nproc-per-node: must be at least 1, not ") + bad));
    }
  }
  EXPECT_THROW(step_shape(0, 1, {"x"}), Error);
  EXPECT_THROW(step_shape(1, 0, {"x"}), Error);

  StepShape s = step_shape(4, 4, {"dtlaunch", "--nproc-per-node", "2", "--", "dtexec", "train"});
  EXPECT_EQ(s.style, LaunchStyle::kNodeLauncher);
  EXPECT_EQ(s.ranks_per_node, 2);
  EXPECT_EQ(s.world_size(), 8);
  EXPECT_EQ(s.describe(), "4 nodes x 2 ranks (dtlaunch per node)");
  try {
    step_shape(2, 4, {"dtlaunch", "--nproc-per-node", "2"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--ntasks-per-node=1"));
  }
}

}  // namespace
}  // namespace dtrain::spank
