// Discovery of the machine the tests run on, checked against what the kernel says in sysfs (not against fixed
// numbers: CI machines are of this project's VM type, 1 NUMA node and 2 cores, but the suite must not depend on it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "dtrain/topology/node_topology.h"
#include "topology_test_support.h"

namespace dtrain::topology {
namespace {

using ::testing::HasSubstr;

TEST(LiveTopology, MatchesSysfs) {
  testing::SysfsFacts facts = testing::sysfs_facts();
  NodeTopology node = discover_node();
  EXPECT_EQ(node.source, "live");
  EXPECT_TRUE(node.path.empty());
  EXPECT_EQ(node.numa_count(), facts.numa_nodes);
  EXPECT_EQ(node.core_count(), facts.cores);
  EXPECT_EQ(node.pus, facts.pus);
  EXPECT_GE(node.packages, 1);
  std::set<int> pus;
  for (const auto& c : node.cores) pus.insert(c.pus.begin(), c.pus.end());
  EXPECT_EQ(static_cast<int>(pus.size()), node.pus);
  for (const auto& n : node.numa_nodes) EXPECT_GT(n.memory_bytes, 0u);
  // hwloc's GPUs are a subset of the NVIDIA display devices on the PCI bus (equal when the driver claims them all).
  EXPECT_LE(node.gpu_count(), facts.nvidia_gpus);
  if (facts.nvidia_gpus == 0) {
    EXPECT_EQ(node.gpu_count(), 0);
    EXPECT_TRUE(node.gpu_gpu.empty());
  }
}

TEST(LiveTopology, WithoutNvidiaDriverNvmlIsReportedUnavailable) {
  NodeTopology node = discover_node();
  if (node.nvml_available) GTEST_SKIP() << "NVML works here: " << node.nvml_status;
  EXPECT_THAT(node.nvml_status, HasSubstr("libnvidia-ml.so.1"));
  for (const auto& g : node.gpus) EXPECT_NE(g.nvlink.source, NvlinkSource::kNvml);
}

TEST(LiveTopology, HwlocXmlFileEnvironmentReadsTheFileWithTheSameChecks) {
  setenv("HWLOC_XMLFILE", testing::fixture(testing::kP4d).c_str(), 1);
  NodeTopology node = discover_node();
  unsetenv("HWLOC_XMLFILE");
  EXPECT_EQ(node.source, "xml");
  EXPECT_EQ(node.gpu_count(), 8);
  ASSERT_FALSE(node.notes.empty());
  EXPECT_THAT(node.notes.back(), HasSubstr("HWLOC_XMLFILE="));
  EXPECT_EQ(load_node_topology(testing::fixture(testing::kP4d)).gpu_count(), 8);
}

}  // namespace
}  // namespace dtrain::topology
