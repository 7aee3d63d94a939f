// Binding local ranks to GPUs, NICs and CPUs: on real topologies (XML), on this machine (no GPU: CPU ranks), and on
// small synthetic nodes for the NIC-sharing rules.
#include "dtrain/topology/binding.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <set>

#include "dtrain/common/error.h"
#include "topology_test_support.h"

namespace dtrain::topology {
namespace {

using ::testing::ElementsAre;
using testing::fixture;
using ::testing::HasSubstr;

void expect_disjoint_cpus(const std::vector<Binding>& bindings) {
  std::set<int> seen;
  for (const auto& b : bindings) {
    EXPECT_FALSE(b.cpus.empty()) << "rank " << b.local_rank;
    EXPECT_FALSE(b.cpus_shared);
    for (int cpu : b.cpus) EXPECT_TRUE(seen.insert(cpu).second) << "CPU " << cpu << " given twice";
  }
}

std::set<int> numa_cpus(const NodeTopology& node, int numa) {
  for (const auto& n : node.numa_nodes) {
    if (n.os_index == numa) return {n.cpus.begin(), n.cpus.end()};
  }
  return {};
}

TEST(Binding, P4dEightRanksGetTheirPixNicAndDisjointLocalCores) {
  NodeTopology node = load_topology_xml(fixture(testing::kP4d));
  std::vector<Binding> b = bind_node(node, 8);
  ASSERT_EQ(b.size(), 8u);
  expect_disjoint_cpus(b);
  for (int r = 0; r < 8; ++r) {
    const Binding& x = b[static_cast<std::size_t>(r)];
    EXPECT_EQ(x.gpu, r);
    EXPECT_EQ(x.gpu_pci_bus_id, node.gpus[static_cast<std::size_t>(r)].pci_bus_id);
    ASSERT_EQ(x.nics.size(), 1u) << "rank " << r;
    EXPECT_EQ(x.nics[0], r / 2);
    EXPECT_EQ(node.gpu_nic[static_cast<std::size_t>(r)][static_cast<std::size_t>(x.nics[0])], Affinity::kPix);
    EXPECT_THAT(x.nic_affinity, ElementsAre(Affinity::kPix));
    EXPECT_EQ(x.numa, r < 4 ? 0 : 1);
    // 24 cores per socket, 4 GPUs per socket: 6 cores (12 hardware threads) each, all on the GPU's socket.
    EXPECT_EQ(x.cores, 6);
    EXPECT_EQ(x.cpus.size(), 12u);
    std::set<int> local = numa_cpus(node, x.numa);
    for (int cpu : x.cpus) EXPECT_EQ(local.count(cpu), 1u) << "rank " << r << " CPU " << cpu;
  }
  EXPECT_THAT(b[0].nic_names, ElementsAre("rdmap16s27"));
  EXPECT_THAT(b[7].nic_names, ElementsAre("rdmap160s27"));
  // bind_local_rank is the same computation, one rank at a time.
  for (int r = 0; r < 8; ++r) {
    Binding one = bind_local_rank(node, r, 8);
    EXPECT_EQ(one.cpus, b[static_cast<std::size_t>(r)].cpus);
    EXPECT_EQ(one.nics, b[static_cast<std::size_t>(r)].nics);
  }
}

TEST(Binding, P4dEnvironment) {
  NodeTopology node = load_topology_xml(fixture(testing::kP4d));
  Binding b = bind_local_rank(node, 5, 8);
  auto env = binding_environment(node, b);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "5");
  EXPECT_EQ(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "6");
  EXPECT_EQ(env.count("NCCL_IB_HCA"), 0u) << "EFA NICs are chosen by the aws-ofi-nccl plugin";
}

TEST(Binding, RestrictedToAllocatedGpus) {
  NodeTopology node = load_topology_xml(fixture(testing::kP4d));
  BindOptions options;
  options.gpus = {4, 5};
  std::vector<Binding> b = bind_node(node, 2, options);
  EXPECT_EQ(b[0].gpu, 4);
  EXPECT_EQ(b[1].gpu, 5);
  EXPECT_THAT(b[0].nic_names, ElementsAre("rdmap144s27"));
  EXPECT_THAT(b[1].nic_names, ElementsAre("rdmap144s27"));
  expect_disjoint_cpus(b);
  // The two ranks share socket 1's 24 cores.
  EXPECT_EQ(b[0].cores, 12);
  options.gpus = {8};
  EXPECT_THROW(bind_node(node, 1, options), Error);
}

TEST(Binding, MoreRanksThanGpusIsAnError) {
  NodeTopology node = load_topology_xml(fixture(testing::kP4d));
  try {
    bind_node(node, 9);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput);
    EXPECT_THAT(e.what(), HasSubstr("9 ranks on a node with 8 usable GPU(s)"));
  }
  EXPECT_THROW(bind_node(node, 0), Error);
  EXPECT_THROW(bind_local_rank(node, 8, 8), Error);
}

TEST(Binding, CpuOnlyRanksOnAGpuNodeSplitAllCoresByNuma) {
  NodeTopology node = load_topology_xml(fixture(testing::kP4d));
  BindOptions options;
  options.cpu_only = true;
  std::vector<Binding> b = bind_node(node, 4, options);
  expect_disjoint_cpus(b);
  for (const auto& x : b) {
    EXPECT_EQ(x.gpu, -1);
    EXPECT_EQ(x.cores, 12);
    EXPECT_EQ(x.numa, x.local_rank < 2 ? 0 : 1);
    EXPECT_EQ(binding_environment(node, x).count("CUDA_VISIBLE_DEVICES"), 0u);
    ASSERT_FALSE(x.nics.empty());
    // CPU ranks take NICs of their NUMA node.
    EXPECT_EQ(node.nics[static_cast<std::size_t>(x.nics[0])].numa, x.numa);
  }
}

TEST(Binding, WholeIoGpuRankGetsItsInfinibandHca) {
  NodeTopology node = load_topology_xml(fixture(testing::kWholeIo));
  Binding b = bind_local_rank(node, 0, 1);
  EXPECT_EQ(b.gpu, 0);
  EXPECT_THAT(b.nic_names, ElementsAre("mlx5_0"));
  EXPECT_EQ(b.numa, 1);
  EXPECT_EQ(b.cores, 8);
  auto env = binding_environment(node, b);
  EXPECT_EQ(env["NCCL_IB_HCA"], "=mlx5_0:1");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "0");
}

TEST(Binding, NodeWithoutGpuBindsCpuRanks) {
  NodeTopology node = load_topology_xml(fixture(testing::k24em64t));
  std::vector<Binding> b = bind_node(node, 2);
  expect_disjoint_cpus(b);
  EXPECT_EQ(b[0].numa, 0);
  EXPECT_EQ(b[1].numa, 1);
  EXPECT_EQ(b[0].cores, 6);
  EXPECT_EQ(format_cpu_list(b[0].cpus), "0,2,4,6,8,10,12,14,16,18,20,22");
  auto env = binding_environment(node, b[0]);
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env.count("NCCL_IB_HCA"), 0u);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "6");
  EXPECT_THAT(b[0].nic_names, ElementsAre("mlx4_0"));
}

TEST(Binding, ThisMachineCpuRanksAreDisjoint) {
  NodeTopology node = discover_node();
  int n = std::max(1, std::min(2, node.core_count()));
  std::vector<Binding> b = bind_node(node, n);
  ASSERT_EQ(static_cast<int>(b.size()), n);
  if (node.gpus.empty()) {
    for (const auto& x : b) {
      EXPECT_EQ(x.gpu, -1);
      EXPECT_EQ(binding_environment(node, x).count("CUDA_VISIBLE_DEVICES"), 0u);
    }
  }
  expect_disjoint_cpus(b);
}

TEST(Binding, MoreRanksThanThreadsShareCpusAndSayItInsteadOfFailing) {
  NodeTopology node = discover_node();
  if (!node.gpus.empty()) GTEST_SKIP() << "this machine has GPUs: CPU-rank oversubscription is not the default path";
  int n = node.pus + 1;
  std::vector<Binding> b = bind_node(node, n);
  ASSERT_EQ(static_cast<int>(b.size()), n);
  bool shared = false;
  for (const auto& x : b) {
    EXPECT_EQ(x.cpus.size(), 1u);
    shared = shared || x.cpus_shared;
  }
  EXPECT_TRUE(shared);
}

TEST(Binding, ApplyCpuAffinityToThisProcess) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  NodeTopology node = discover_node();
  Binding b = bind_local_rank(node, 0, 1, BindOptions{{}, true});
  ASSERT_FALSE(b.cpus.empty());
  // Bind to the first CPU only, which this process may use.
  b.cpus.resize(1);
  apply_cpu_affinity(b);
  cpu_set_t after;
  ASSERT_EQ(sched_getaffinity(0, sizeof(after), &after), 0);
  EXPECT_EQ(CPU_COUNT(&after), 1);
  EXPECT_TRUE(CPU_ISSET(static_cast<std::size_t>(b.cpus[0]), &after));
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
}

TEST(Binding, ApplyCpuAffinityOnCpusThisMachineLacksFails) {
  Binding b;
  b.cpus = {4000, 4001};
  try {
    apply_cpu_affinity(b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kFailure);
    EXPECT_THAT(e.what(), HasSubstr("4000-4001"));
  }
  Binding none;
  EXPECT_NO_THROW(apply_cpu_affinity(none));
}

// A synthetic node: `gpus` GPUs split over two NUMA nodes of 8 cores each, and NICs with the given GPU affinities.
NodeTopology synthetic(int gpus, const std::vector<std::vector<Affinity>>& gpu_nic, const std::vector<int>& nic_numa) {
  NodeTopology node;
  for (int numa = 0; numa < 2; ++numa) {
    NumaNode n;
    n.os_index = numa;
    for (int c = 0; c < 8; ++c) n.cpus.push_back(numa * 8 + c);
    node.numa_nodes.push_back(n);
    for (int c = 0; c < 8; ++c) node.cores.push_back(Core{numa * 8 + c, numa, numa, {numa * 8 + c}});
  }
  node.pus = 16;
  for (int g = 0; g < gpus; ++g) {
    Gpu gpu;
    gpu.index = g;
    gpu.numa = g < gpus / 2 ? 0 : 1;
    node.gpus.push_back(gpu);
  }
  for (std::size_t k = 0; k < nic_numa.size(); ++k) {
    Nic nic;
    nic.name = "mlx5_" + std::to_string(k);
    nic.kind = NicKind::kInfiniBand;
    nic.numa = nic_numa[k];
    nic.ports = {NicPort{1, 4, 25, ""}};
    node.nics.push_back(nic);
  }
  node.gpu_nic = gpu_nic;
  return node;
}

TEST(Binding, FewerNicsThanGpusAreSharedByNuma) {
  using A = Affinity;
  std::vector<std::vector<A>> gn;
  for (int g = 0; g < 8; ++g)
    gn.push_back(g < 4 ? std::vector<A>{A::kNode, A::kSys} : std::vector<A>{A::kSys, A::kNode});
  NodeTopology node = synthetic(8, gn, {0, 1});
  std::vector<Binding> b = bind_node(node, 8);
  for (int r = 0; r < 8; ++r) EXPECT_THAT(b[static_cast<std::size_t>(r)].nics, ElementsAre(r < 4 ? 0 : 1));
  expect_disjoint_cpus(b);
  EXPECT_EQ(b[0].cores, 2);
}

TEST(Binding, MoreNicsThanGpusAreSplitWithoutOverlap) {
  using A = Affinity;
  // Both GPUs are PIX-close to all four NICs (one PCIe switch): each rank gets two of them.
  NodeTopology node =
      synthetic(2, {{A::kPix, A::kPix, A::kPix, A::kPix}, {A::kPix, A::kPix, A::kPix, A::kPix}}, {0, 0, 1, 1});
  std::vector<Binding> b = bind_node(node, 2);
  EXPECT_THAT(b[0].nics, ElementsAre(0, 1));
  EXPECT_THAT(b[1].nics, ElementsAre(2, 3));
  EXPECT_EQ(binding_environment(node, b[1])["NCCL_IB_HCA"], "=mlx5_2:1,mlx5_3:1");
  // A NIC whose port is down is never chosen.
  node.nics[0].ports[0].state = 1;
  b = bind_node(node, 2);
  EXPECT_THAT(b[0].nics, ElementsAre(1));
  EXPECT_THAT(b[1].nics, ElementsAre(2, 3));
}

TEST(Binding, CpuListFormat) {
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_EQ(format_cpu_list({3, 0, 1, 2, 48, 49, 7}), "0-3,7,48-49");
  EXPECT_EQ(format_cpu_list({5, 5}), "5");
}

}  // namespace
}  // namespace dtrain::topology
