// The built-in description of this machine's CPU ranks and examples/clusters/local-cpu.toml say the same.
#include "dtrain/topology/local_cpu.h"

#include <gtest/gtest.h>

#include <string>

namespace dtrain::topology {
namespace {

const std::string kExample = std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/local-cpu.toml";

// cluster_toml writes every field the planner reads (what a plan file embeds) and canonical_text is what the
// cluster digest is taken over: equal texts plan alike and give plans of one digest.
TEST(LocalCpuCluster, IsTheExampleFile) {
  const ClusterSpec file = load_cluster(kExample);
  const ClusterSpec built = local_cpu_cluster(file.node.gpus);
  EXPECT_EQ(file.node.gpus, 4);
  EXPECT_EQ(cluster_toml(built, ""), cluster_toml(file, ""));
  EXPECT_EQ(canonical_text(built), canonical_text(file));
}

TEST(LocalCpuCluster, OneNodeOfTheRanks) {
  const ClusterSpec c = local_cpu_cluster(3);
  EXPECT_EQ(c.nodes, 1);
  EXPECT_EQ(c.node.gpus, 3);
  EXPECT_EQ(c.node.nvlink_domain, 3);
  EXPECT_NO_THROW(validate(c));
}

}  // namespace
}  // namespace dtrain::topology
