// The anomaly checks on small synthetic nodes (the XML fixtures are healthy machines).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "dtrain/topology/node_topology.h"
#include "topology_internal.h"

namespace dtrain::topology {
namespace {

using ::testing::HasSubstr;

NodeTopology two_socket_node() {
  NodeTopology node;
  for (int g = 0; g < 4; ++g) {
    Gpu gpu;
    gpu.index = g;
    gpu.pci_bus_id = "0000:0" + std::to_string(g) + ":00.0";
    gpu.model = "NVIDIA H100 80GB HBM3";
    gpu.numa = g < 2 ? 0 : 1;
    node.gpus.push_back(gpu);
  }
  for (int k = 0; k < 2; ++k) {
    Nic nic;
    nic.name = "mlx5_" + std::to_string(k);
    nic.numa = k;
    nic.ports = {NicPort{1, 4, 50, "400 Gb/sec (4X NDR)"}};
    node.nics.push_back(nic);
  }
  return node;
}

std::map<std::string, std::vector<std::string>> by_kind(const NodeTopology& node) {
  std::map<std::string, std::vector<std::string>> m;
  for (const auto& a : node.anomalies) m[a.kind].push_back(a.message);
  return m;
}

TEST(Anomalies, HealthyNodeHasNone) {
  NodeTopology node = two_socket_node();
  detail::find_anomalies(node);
  EXPECT_TRUE(node.anomalies.empty());
}

TEST(Anomalies, PortDownLeavesTheSocketWithoutLocalNic) {
  NodeTopology node = two_socket_node();
  node.nics[1].ports[0].state = 1;
  detail::find_anomalies(node);
  auto m = by_kind(node);
  ASSERT_EQ(m["nic_port_down"].size(), 1u);
  EXPECT_THAT(m["nic_port_down"][0], HasSubstr("NIC mlx5_1"));
  EXPECT_THAT(m["nic_port_down"][0], HasSubstr("state down"));
  ASSERT_EQ(m["gpu_without_local_nic"].size(), 2u);
  EXPECT_THAT(m["gpu_without_local_nic"][0], HasSubstr("GPU2 (0000:02:00.0) on NUMA node 1"));
  EXPECT_THAT(m["gpu_without_local_nic"][1], HasSubstr("GPU3"));
}

TEST(Anomalies, MixedModels) {
  NodeTopology node = two_socket_node();
  node.gpus[3].model = "NVIDIA A100-SXM4-80GB";
  detail::find_anomalies(node);
  auto m = by_kind(node);
  ASSERT_EQ(m["mixed_gpu_models"].size(), 1u);
  EXPECT_THAT(m["mixed_gpu_models"][0], HasSubstr("NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3"));
}

TEST(Anomalies, GpuNodeWithoutRdmaNic) {
  NodeTopology node = two_socket_node();
  node.nics.clear();
  detail::find_anomalies(node);
  auto m = by_kind(node);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(m["no_rdma_nic"].size(), 1u);
}

TEST(Anomalies, InferredNvlinkNeverCountsAsDegraded) {
  NodeTopology node = two_socket_node();
  for (auto& g : node.gpus) g.nvlink = GpuNvlink{18, 18, 25, 450, 4, NvlinkSource::kInferred};
  node.gpus[1].nvlink.links = 12;  // cannot happen when inferred; observed figures alone reveal broken links
  detail::find_anomalies(node);
  EXPECT_TRUE(node.anomalies.empty());
  node.anomalies.clear();
  for (auto& g : node.gpus) g.nvlink.source = NvlinkSource::kHwloc;
  detail::find_anomalies(node);
  auto m = by_kind(node);
  ASSERT_EQ(m["nvlink_degraded"].size(), 1u);
  EXPECT_THAT(m["nvlink_degraded"][0],
              HasSubstr("GPU1 (0000:01:00.0) has 12 active NVLink links where its peers have 18"));
}

}  // namespace
}  // namespace dtrain::topology
