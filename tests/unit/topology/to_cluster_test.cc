// A discovered node as the planner's cluster description, with provenance.
#include "dtrain/topology/to_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/toml_reader.h"
#include "topology_test_support.h"

namespace dtrain::topology {
namespace {

using ::testing::ElementsAre;
using testing::fixture;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ToCluster, P4dNvlinkInferredEfaRails) {
  ClusterSpec c = load_cluster_from_topology(fixture(testing::kP4d), 16);
  EXPECT_EQ(c.name, "p4d.24xlarge");
  EXPECT_EQ(c.nodes, 16);
  EXPECT_EQ(c.total_gpus(), 128);
  EXPECT_EQ(c.node.gpus, 8);
  EXPECT_EQ(c.node.gpu.name, "A100-SXM4-40GB");
  EXPECT_DOUBLE_EQ(c.node.gpu.memory_gib, 40);
  EXPECT_EQ(c.node.nvlink_domain, 8);
  EXPECT_DOUBLE_EQ(c.node.nvlink_gbps, 300);
  EXPECT_EQ(c.node.nics, 4);
  EXPECT_DOUBLE_EQ(c.node.nic_gbps, 12.5);
  EXPECT_DOUBLE_EQ(c.node.pcie_gbps, 31.51);
  EXPECT_THAT(c.node.nic_of_gpu, ElementsAre(0, 0, 1, 1, 2, 2, 3, 3));
  EXPECT_DOUBLE_EQ(c.node.network_gbps_per_gpu(), 6.25);
  EXPECT_FALSE(c.network.efficiency.empty());
  EXPECT_THAT(c.provenance["node.nvlink_gbps"], StartsWith("inferred: NVSwitch PCI devices + A100-SXM4-40GB"));
  EXPECT_THAT(c.provenance["node.nvlink_gbps"], HasSubstr("12 NVLink3 links x 25 GB/s"));
  EXPECT_THAT(c.provenance["node.nvlink_domain"], StartsWith("inferred:"));
  EXPECT_THAT(c.provenance["node.gpu"], StartsWith("observed:"));
  EXPECT_THAT(c.provenance["node.nics"], StartsWith("observed: 4 usable RDMA NIC(s)"));
  EXPECT_THAT(c.provenance["node.nic_gbps"], StartsWith("inferred: nominal rate of PCI 1d0f:efa0"));
  EXPECT_THAT(c.provenance["node.pcie_gbps"], StartsWith("observed:"));
  EXPECT_THAT(c.provenance["network"], StartsWith("defaulted:"));
}

TEST(ToCluster, Dgx2NvlinkObservedFromHwlocMatrix) {
  ClusterSpec c = load_cluster_from_topology(fixture(testing::kDgx2), 1);
  EXPECT_EQ(c.node.gpus, 16);
  EXPECT_EQ(c.node.gpu.name, "V100-SXM3-32GB");
  EXPECT_EQ(c.node.nvlink_domain, 16);
  EXPECT_DOUBLE_EQ(c.node.nvlink_gbps, 150);
  EXPECT_EQ(c.node.nics, 0);
  EXPECT_THAT(c.provenance["node.nvlink_gbps"],
              StartsWith("observed: hwloc NVLinkBandwidth matrix, 6 NVLink2 links x 25 GB/s per GPU"));
  EXPECT_THAT(c.provenance["node.nic_gbps"], StartsWith("defaulted:"));
}

TEST(ToCluster, Dgx2ManyNodesDefaultsTheMissingNetworkAndSaysSo) {
  ClusterSpec c = load_cluster_from_topology(fixture(testing::kDgx2), 4);
  EXPECT_EQ(c.node.nics, 16);
  EXPECT_DOUBLE_EQ(c.node.nic_gbps, 25);
  EXPECT_THAT(c.provenance["node.nics"], StartsWith("defaulted: 16 (one per GPU)"));
  EXPECT_THAT(c.provenance["node.nic_gbps"], StartsWith("defaulted:"));
}

TEST(ToCluster, NodeTomlRoundTripsThroughTheClusterParser) {
  ClusterSpec c = load_cluster_from_topology(fixture(testing::kP4d), 2);
  std::string text = "format = 1\n[cluster]\nname = \"p4d\"\nnodes = 2\n" + node_toml(c);
  ClusterSpec back = parse_cluster(TomlDocument::parse_string(text, "generated.toml"));
  EXPECT_EQ(back.node.gpus, c.node.gpus);
  EXPECT_EQ(back.node.gpu.name, c.node.gpu.name);
  EXPECT_EQ(back.node.nvlink_domain, c.node.nvlink_domain);
  EXPECT_DOUBLE_EQ(back.node.nvlink_gbps, c.node.nvlink_gbps);
  EXPECT_EQ(back.node.nics, c.node.nics);
  EXPECT_DOUBLE_EQ(back.node.nic_gbps, c.node.nic_gbps);
  EXPECT_DOUBLE_EQ(back.node.pcie_gbps, c.node.pcie_gbps);
  EXPECT_EQ(back.node.nic_of_gpu, c.node.nic_of_gpu);
}

TEST(ToCluster, TomlCarriesProvenanceComments) {
  std::string toml = node_toml_with_provenance(load_cluster_from_topology(fixture(testing::kP4d), 1));
  EXPECT_THAT(toml, HasSubstr("# inferred: NVSwitch PCI devices + A100-SXM4-40GB generation, 12 NVLink3 links x 25 "
                              "GB/s per GPU\nnvlink_gbps = 300\n"));
  EXPECT_THAT(toml, HasSubstr("\n[node]\n"));
  EXPECT_THAT(toml, HasSubstr("nic_of_gpu = [0, 0, 1, 1, 2, 2, 3, 3]\n"));
}

void expect_topology_error(const std::string& xml, const std::string& what) {
  try {
    load_cluster_from_topology(xml, 1);
    FAIL() << xml;
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
}

TEST(ToCluster, NodeWithoutGpuIsAnError) { expect_topology_error(fixture(testing::k24em64t), "has no NVIDIA GPU"); }

TEST(ToCluster, GpuOutsideTheCatalogIsAnErrorNamingTheModel) {
  expect_topology_error(fixture(testing::kWholeIo), "GPU model \"Tesla K40m\" (PCI 10de:1094) is not in dtrain's");
}

TEST(ToCluster, ThisMachine) {
  NodeTopology node = discover_node();
  if (!node.gpus.empty()) {
    ClusterSpec c = cluster_from_topology(node, 1);
    EXPECT_EQ(c.node.gpus, node.gpu_count());
    return;
  }
  expect_topology_error("", "this machine has no NVIDIA GPU");
}

TEST(ToCluster, NodesMustBePositive) {
  NodeTopology node = load_topology_xml(fixture(testing::kP4d));
  EXPECT_THROW(cluster_from_topology(node, 0), Error);
}

}  // namespace
}  // namespace dtrain::topology
