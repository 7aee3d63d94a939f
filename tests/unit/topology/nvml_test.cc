// NVML loaded at run time: absent (this machine and CI have no NVIDIA driver), too old, failing, and present (a fake
// libnvidia-ml built by this test suite, tests/unit/topology/fake_nvml.cc), and how its answers become NVLink figures.
#include "dtrain/topology/nvml.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "dtrain/topology/node_topology.h"
#include "topology_internal.h"

namespace dtrain::topology {
namespace {

using ::testing::HasSubstr;

// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST(Nvml, MissingLibraryDegradesWithAReason) {
  NvmlReport r = query_nvml("/nonexistent/libnvidia-ml.so.1");
  EXPECT_FALSE(r.available);
  EXPECT_TRUE(r.gpus.empty());
  EXPECT_THAT(r.status, HasSubstr("not loaded"));
  EXPECT_THAT(r.status, HasSubstr("/nonexistent/libnvidia-ml.so.1"));
}

TEST(Nvml, DefaultLibraryAbsentOnThisMachine) {
  void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h != nullptr) {
    dlclose(h);
    GTEST_SKIP() << "libnvidia-ml.so.1 is installed here: the absent-driver path cannot be observed";
  }
  NvmlReport r = query_nvml();
  EXPECT_FALSE(r.available);
  EXPECT_THAT(r.status, HasSubstr("libnvidia-ml.so.1 not loaded"));
}

TEST(Nvml, LibraryWithoutRequiredSymbol) {
  NvmlReport r = query_nvml(FAKE_NVML_OLD_PATH);
  EXPECT_FALSE(r.available);
  EXPECT_THAT(r.status, HasSubstr("lacks nvmlDeviceGetPciInfo_v3"));
}

TEST(Nvml, InitFailureIsReported) {
  ScopedEnv mode("FAKE_NVML_MODE", "init_fails");
  NvmlReport r = query_nvml(FAKE_NVML_PATH);
  EXPECT_FALSE(r.available);
  EXPECT_THAT(r.status, HasSubstr("nvmlInit failed: Driver Not Loaded"));
}

TEST(Nvml, ReadsNamesMemoryAndLinks) {
  NvmlReport r = query_nvml(FAKE_NVML_PATH);
  ASSERT_TRUE(r.available) << r.status;
  ASSERT_EQ(r.gpus.size(), 8u);
  EXPECT_EQ(r.gpus[0].pci_bus_id, "0000:18:00.0");
  EXPECT_EQ(r.gpus[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(r.gpus[0].memory_bytes, 85520809984ULL);
  EXPECT_EQ(r.gpus[0].active_links.size(), 18u);
  EXPECT_EQ(r.gpus[3].active_links.size(), 17u);
  const NvmlLink& l = r.gpus[0].active_links[1];
  EXPECT_EQ(l.link, 1);
  EXPECT_EQ(l.version, 4);
  EXPECT_EQ(l.remote_pci_bus_id, "0000:06:00.0");
  EXPECT_EQ(l.remote_pci_device_id, (0x22a3u << 16) | 0x10deu);
}

// A node with the fake board's GPUs, as hwloc would have found them on the PCI bus.
NodeTopology node_with_gpus(const NvmlReport& r, const std::string& catalog) {
  NodeTopology node;
  for (const auto& ng : r.gpus) {
    Gpu g;
    g.index = ng.index;
    g.pci_bus_id = ng.pci_bus_id;
    g.vendor_id = 0x10de;
    g.model = ng.name;
    g.catalog_name = catalog;
    node.gpus.push_back(g);
  }
  node.gpu_gpu.assign(node.gpus.size(), std::vector<Link>(node.gpus.size(), Link{Affinity::kSys, 0}));
  return node;
}

TEST(Nvml, SwitchLinksMakeOneDomainAndADownLinkIsAnAnomaly) {
  NvmlReport r = query_nvml(FAKE_NVML_PATH);
  ASSERT_TRUE(r.available) << r.status;
  NodeTopology node = node_with_gpus(r, "H100-SXM");
  detail::NvlinkGraph graph = detail::nvlink_from_nvml(node, r);
  EXPECT_EQ(graph.source, NvlinkSource::kNvml);
  detail::apply_nvlink(node, graph);
  for (const auto& g : node.gpus) {
    EXPECT_EQ(g.nvlink.source, NvlinkSource::kNvml);
    EXPECT_EQ(g.nvlink.links, g.index == 3 ? 17 : 18);
    EXPECT_EQ(g.nvlink.switch_links, g.nvlink.links);
    EXPECT_DOUBLE_EQ(g.nvlink.link_gbps, 25.0);
    EXPECT_EQ(g.nvlink.version, 4);
  }
  EXPECT_DOUBLE_EQ(node.gpus[0].nvlink.gbps, 450.0);
  EXPECT_EQ(label(node.gpu_gpu[0][1]), "NV18");
  EXPECT_EQ(label(node.gpu_gpu[0][3]), "NV17");
  detail::find_anomalies(node);
  std::vector<std::string> degraded;
  for (const auto& a : node.anomalies) {
    if (a.kind == "nvlink_degraded") degraded.push_back(a.message);
  }
  ASSERT_EQ(degraded.size(), 1u);
  EXPECT_THAT(degraded[0], HasSubstr("GPU3 (0000:5d:00.0) has 17 active NVLink links where its peers have 18"));
}

TEST(Nvml, DirectLinksBetweenTwoGpus) {
  ScopedEnv mode("FAKE_NVML_MODE", "direct");
  NvmlReport r = query_nvml(FAKE_NVML_PATH);
  ASSERT_TRUE(r.available) << r.status;
  ASSERT_EQ(r.gpus.size(), 2u);
  NodeTopology node = node_with_gpus(r, "H100-PCIE");
  detail::apply_nvlink(node, detail::nvlink_from_nvml(node, r));
  EXPECT_EQ(node.gpus[0].nvlink.links, 4);
  EXPECT_EQ(node.gpus[0].nvlink.switch_links, 0);
  EXPECT_DOUBLE_EQ(node.gpus[0].nvlink.gbps, 100.0);
  EXPECT_EQ(label(node.gpu_gpu[0][1]), "NV4");
  EXPECT_EQ(label(node.gpu_gpu[1][0]), "NV4");
}

TEST(Nvml, LinkBandwidthByVersion) {
  EXPECT_DOUBLE_EQ(detail::nvlink_link_gbps_for_version(1), 20.0);
  EXPECT_DOUBLE_EQ(detail::nvlink_link_gbps_for_version(4), 25.0);
  EXPECT_DOUBLE_EQ(detail::nvlink_link_gbps_for_version(7), 50.0);
  EXPECT_DOUBLE_EQ(detail::nvlink_link_gbps_for_version(0), 0.0);
}

TEST(NicRates, SysfsRateText) {
  EXPECT_DOUBLE_EQ(detail::parse_sysfs_rate_gbps("200 Gb/sec (4X HDR)"), 25.0);
  EXPECT_DOUBLE_EQ(detail::parse_sysfs_rate_gbps("400 Gb/sec (4X NDR)\n"), 50.0);
  EXPECT_DOUBLE_EQ(detail::parse_sysfs_rate_gbps("2.5 Gb/sec (1X SDR)"), 0.3125);
  EXPECT_DOUBLE_EQ(detail::parse_sysfs_rate_gbps("unknown"), 0.0);
}

TEST(NicRates, ReadsPortsFromASysfsTree) {
  char dir_template[] = "/tmp/dtrain-sysfs-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string root = dir_template;
  std::string port = root + "/mlx5_3/ports/1";
  std::filesystem::create_directories(port);
  auto write = [](const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  write(port + "/state", "4: ACTIVE\n");
  write(port + "/rate", "200 Gb/sec (4X HDR)\n");
  write(port + "/link_layer", "Ethernet\n");
  Nic nic;
  nic.name = "mlx5_3";
  std::string link_layer;
  ASSERT_TRUE(detail::read_sysfs_nic(root, nic, link_layer));
  ASSERT_EQ(nic.ports.size(), 1u);
  EXPECT_EQ(nic.ports[0].state, 4);
  EXPECT_EQ(nic.ports[0].rate_text, "200 Gb/sec (4X HDR)");
  EXPECT_DOUBLE_EQ(nic.gbps, 25.0);
  EXPECT_EQ(nic.gbps_source, "sysfs");
  EXPECT_EQ(link_layer, "Ethernet");
  EXPECT_EQ(detail::nic_kind(nic.name, 0x15b3, 0x0200, {}, link_layer), NicKind::kRoce);
  Nic absent;
  absent.name = "mlx5_9";
  EXPECT_FALSE(detail::read_sysfs_nic(root, absent, link_layer));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace dtrain::topology
