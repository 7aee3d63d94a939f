// Node topology read from real machines' hwloc XML files (tests/data/topologies/README.md), and the bad inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "dtrain/common/error.h"
#include "dtrain/topology/gpu_catalog.h"
#include "dtrain/topology/node_topology.h"
#include "topology_test_support.h"

namespace dtrain::topology {
namespace {

using ::testing::ElementsAre;
using testing::fixture;
using ::testing::HasSubstr;

std::set<std::string> anomaly_kinds(const NodeTopology& node) {
  std::set<std::string> kinds;
  for (const auto& a : node.anomalies) kinds.insert(a.kind);
  return kinds;
}

TEST(XmlTopology, Dgx2Has16V100With6LinksEachThrough12NvSwitches) {
  NodeTopology node = load_topology_xml(fixture(testing::kDgx2));
  EXPECT_EQ(node.source, "xml");
  EXPECT_EQ(node.machine, "NVIDIA DGX-2H");
  ASSERT_EQ(node.gpu_count(), 16);
  for (const auto& g : node.gpus) {
    EXPECT_EQ(g.model, "Tesla V100-SXM3-32GB-H");
    EXPECT_EQ(g.model_source, "nvml");
    EXPECT_EQ(g.catalog_name, "V100-SXM3-32GB");
    EXPECT_EQ(g.memory_bytes, 32ULL << 30) << "32 GB from the catalog: the XML has no memory size";
    EXPECT_EQ(g.vendor_id, 0x10deu);
    EXPECT_EQ(g.device_id, 0x1db8u);
    EXPECT_EQ(g.nvlink.source, NvlinkSource::kHwloc);
    EXPECT_EQ(g.nvlink.links, 6) << "GPU" << g.index;
    EXPECT_EQ(g.nvlink.switch_links, 6);
    EXPECT_DOUBLE_EQ(g.nvlink.link_gbps, 25.0);
    EXPECT_DOUBLE_EQ(g.nvlink.gbps, 150.0);
    EXPECT_EQ(g.nvlink.version, 2);
    EXPECT_EQ(g.numa, g.index < 8 ? 0 : 1);
  }
  EXPECT_EQ(node.nvswitches.size(), 12u);
  // Every pair, also across the two baseboards, is joined through the switches.
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      const Link& l = node.gpu_gpu[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
      if (i == j) {
        EXPECT_EQ(l.affinity, Affinity::kSelf);
      } else {
        EXPECT_EQ(l.affinity, Affinity::kNvlink) << i << "-" << j;
        EXPECT_EQ(label(l), "NV6");
      }
    }
  }
  EXPECT_TRUE(node.nics.empty());
  EXPECT_EQ(anomaly_kinds(node), std::set<std::string>{"no_rdma_nic"});
}

TEST(XmlTopology, P4dHas8A100WithInferredNvlinkAnd4EfaNicsEachPixToTwoGpus) {
  NodeTopology node = load_topology_xml(fixture(testing::kP4d));
  EXPECT_EQ(node.machine, "p4d.24xlarge");
  EXPECT_EQ(node.packages, 2);
  EXPECT_EQ(node.numa_count(), 2);
  EXPECT_EQ(node.core_count(), 48);
  EXPECT_EQ(node.pus, 96);
  ASSERT_EQ(node.gpu_count(), 8);
  for (const auto& g : node.gpus) {
    EXPECT_EQ(g.model, "NVIDIA A100-SXM4-40GB");
    EXPECT_EQ(g.catalog_name, "A100-SXM4-40GB");
    EXPECT_EQ(g.device_id, 0x20b0u);
    // OpenCLGlobalMemorySize = 41410944 KiB.
    EXPECT_EQ(g.memory_bytes, 41410944ULL * 1024);
    EXPECT_EQ(g.nvlink.source, NvlinkSource::kInferred);
    EXPECT_EQ(g.nvlink.links, 12);
    EXPECT_DOUBLE_EQ(g.nvlink.gbps, 300.0);
    EXPECT_EQ(g.numa, g.index < 4 ? 0 : 1);
    EXPECT_DOUBLE_EQ(g.pcie_gbps, 31.51);  // PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130
  }
  EXPECT_EQ(node.gpus[0].pci_bus_id, "0000:10:1c.0");
  EXPECT_EQ(node.nvswitches.size(), 6u);
  for (const auto& s : node.nvswitches) EXPECT_EQ(s.device_id, 0x1af1u);
  for (std::size_t i = 0; i < 8; ++i) {
    for (std::size_t j = 0; j < 8; ++j) {
      if (i != j) {
        EXPECT_EQ(label(node.gpu_gpu[i][j]), "NV12");
      }
    }
  }
  ASSERT_EQ(node.nics.size(), 4u);
  std::vector<std::string> names;
  for (const auto& n : node.nics) {
    names.push_back(n.name);
    EXPECT_EQ(n.kind, NicKind::kEfa);
    EXPECT_EQ(n.state_name(), "active");
    EXPECT_DOUBLE_EQ(n.gbps, 12.5);
    EXPECT_THAT(n.gbps_source, HasSubstr("inferred"));
  }
  EXPECT_THAT(names, ElementsAre("rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"));
  for (std::size_t k = 0; k < 4; ++k) {
    std::vector<int> pix;
    for (std::size_t g = 0; g < 8; ++g) {
      if (node.gpu_nic[g][k] == Affinity::kPix) pix.push_back(static_cast<int>(g));
    }
    EXPECT_THAT(pix, ElementsAre(2 * static_cast<int>(k), 2 * static_cast<int>(k) + 1)) << node.nics[k].name;
  }
  // The other NIC on the same socket is NODE, those on the other socket SYS.
  EXPECT_EQ(node.gpu_nic[0][1], Affinity::kNode);
  EXPECT_EQ(node.gpu_nic[0][2], Affinity::kSys);
  EXPECT_TRUE(node.anomalies.empty());
}

TEST(XmlTopology, WholeIoHasCuda0AndActiveMlx5InOnePciSwitch) {
  NodeTopology node = load_topology_xml(fixture(testing::kWholeIo));
  ASSERT_EQ(node.gpu_count(), 1) << "only the NVIDIA board with a CUDA device counts";
  const Gpu& gpu = node.gpus[0];
  EXPECT_THAT(gpu.os_devices, ::testing::Contains("cuda0"));
  EXPECT_EQ(gpu.model, "Tesla K40m");
  EXPECT_EQ(gpu.model_source, "cuda");
  EXPECT_EQ(gpu.memory_bytes, 11796032ULL * 1024);
  EXPECT_EQ(gpu.pci_bus_id, "0000:84:00.0");
  EXPECT_EQ(gpu.numa, 1);
  EXPECT_EQ(gpu.catalog_name, "");
  EXPECT_EQ(gpu.nvlink.source, NvlinkSource::kNone);
  ASSERT_EQ(node.nics.size(), 1u);
  const Nic& nic = node.nics[0];
  EXPECT_EQ(nic.name, "mlx5_0");
  EXPECT_EQ(nic.kind, NicKind::kInfiniBand);
  ASSERT_EQ(nic.ports.size(), 1u);
  EXPECT_EQ(nic.ports[0].number, 1);
  EXPECT_EQ(nic.ports[0].state, 4);
  EXPECT_EQ(nic.state_name(), "active");
  EXPECT_EQ(nic.port(), 1);
  EXPECT_THAT(nic.netdevs, ElementsAre("ib0"));
  EXPECT_EQ(nic.numa, 1);
  // Both sit directly below root port 0000:80:03.0.
  EXPECT_EQ(node.gpu_nic[0][0], Affinity::kPix);
  EXPECT_TRUE(node.anomalies.empty());
  ASSERT_EQ(node.notes.size(), 1u);
  EXPECT_THAT(node.notes[0], HasSubstr("0000:03:00.0 (10de:1094)"));
}

TEST(XmlTopology, TwentyFourEm64tHasMlx4AndNoGpu) {
  NodeTopology node = load_topology_xml(fixture(testing::k24em64t));
  EXPECT_EQ(node.gpu_count(), 0);
  EXPECT_EQ(node.numa_count(), 2);
  EXPECT_EQ(node.core_count(), 12);
  EXPECT_EQ(node.pus, 24);
  ASSERT_EQ(node.nics.size(), 1u);
  EXPECT_EQ(node.nics[0].name, "mlx4_0");
  EXPECT_EQ(node.nics[0].kind, NicKind::kInfiniBand);
  EXPECT_THAT(node.nics[0].netdevs, ::testing::Contains("ib0"));
  EXPECT_EQ(node.nics[0].state_name(), "unknown") << "the XML records no port state";
  EXPECT_TRUE(node.nics[0].usable());
  EXPECT_TRUE(node.anomalies.empty());
  // Three Fermi boards without any driver device: noted, not counted.
  ASSERT_EQ(node.notes.size(), 1u);
  EXPECT_THAT(node.notes[0], HasSubstr("3 NVIDIA display device(s)"));
}

TEST(XmlTopology, CoresPartitionThePus) {
  for (const auto& name : {testing::kDgx2, testing::kP4d, testing::kWholeIo, testing::k24em64t}) {
    NodeTopology node = load_topology_xml(fixture(name));
    std::set<int> pus;
    for (const auto& c : node.cores) {
      EXPECT_FALSE(c.pus.empty());
      EXPECT_GE(c.numa, 0) << name;
      for (int pu : c.pus) EXPECT_TRUE(pus.insert(pu).second) << name << ": PU " << pu << " in two cores";
    }
    EXPECT_EQ(static_cast<int>(pus.size()), node.pus) << name;
  }
}

void expect_bad_input(const std::string& path, const std::string& what, const std::string& todo) {
  try {
    load_topology_xml(path);
    FAIL() << path << " loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_THAT(e.what(), HasSubstr(path));
    EXPECT_THAT(e.what(), HasSubstr(what));
    EXPECT_THAT(e.what(), HasSubstr(todo));
  }
}

TEST(XmlTopologyErrors, MissingFile) {
  expect_bad_input(fixture("bad/missing.xml"), "no such file", "lstopo --whole-io --of xml");
}

TEST(XmlTopologyErrors, Directory) { expect_bad_input(fixture("bad"), "is a directory", "lstopo"); }

TEST(XmlTopologyErrors, NotXml) {
  expect_bad_input(fixture("bad/not-xml.xml"), "is not XML (it starts with \"This is a plain", "lstopo");
}

TEST(XmlTopologyErrors, XmlButNotATopology) {
  expect_bad_input(fixture("bad/not-topology.xml"), "not an hwloc topology", "lstopo --whole-io --of xml");
}

TEST(XmlTopologyErrors, Hwloc3Xml) {
  expect_bad_input(fixture("bad/hwloc3.xml"), "hwloc 3.0 XML", "--export-xml-flags v2");
}

TEST(XmlTopologyErrors, XmlWithoutIoObjects) {
  expect_bad_input(fixture("bad/no-io.xml"), "has no I/O objects", "lstopo --whole-io --of xml");
}

TEST(XmlTopologyErrors, TruncatedXml) {
  expect_bad_input(fixture("bad/truncated.xml"), "could not read", "complete file");
}

TEST(PciBusId, NormalizesNvmlAndShortForms) {
  EXPECT_EQ(normalize_pci_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("0000:1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("1b:00.1"), "0000:1b:00.1");
  EXPECT_EQ(normalize_pci_bus_id("not a bus id"), "not a bus id");
  EXPECT_EQ(format_pci_bus_id(0, 0xa0, 0x1c, 0), "0000:a0:1c.0");
}

TEST(GpuCatalog, DriverNamesAndPciIdsMatchCatalogEntries) {
  EXPECT_EQ(find_gpu("NVIDIA A100-SXM4-40GB")->name, "A100-SXM4-40GB");
  EXPECT_EQ(find_gpu("Tesla V100-SXM3-32GB-H")->name, "V100-SXM3-32GB");
  EXPECT_EQ(find_gpu("NVIDIA H100 80GB HBM3")->name, "H100-SXM");
  EXPECT_EQ(find_gpu("10de:20b0")->name, "A100-SXM4-40GB");
  EXPECT_EQ(find_gpu("10de:2330")->name, "H100-SXM");
  EXPECT_EQ(find_gpu("10de:2335")->name, "H200");
  EXPECT_FALSE(find_gpu("Tesla K40m").has_value());
  EXPECT_FALSE(find_gpu("nvidia-").has_value());
}

}  // namespace
}  // namespace dtrain::topology
