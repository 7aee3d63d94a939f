#include "dtrain/spank/environment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "dtrain/common/error.h"
#include "dtrain/plan/placement.h"
#include "dtrain/topology/node_topology.h"

namespace dtrain::spank {
namespace {

using ::testing::HasSubstr;

const std::string kTopologies = std::string(DTRAIN_SOURCE_DIR) + "/tests/data/topologies/";

std::map<std::string, std::string> as_map(const EnvList& env) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : env) {
    EXPECT_TRUE(m.emplace(k, v).second) << "set twice: " << k;
  }
  return m;
}

// 2 nodes x 4 ranks, tp=2 pp=2 dp=2 (tp-dp-pp placement), on node 1.
StepEnvironment sample_step() {
  StepEnvironment s;
  s.shape = step_shape(2, 8, {"python3", "train.py"});
  s.node_index = 1;
  s.master_addr = "10.0.0.1";
  s.master_port = 29517;
  s.store_token = std::string(64, 'a');
  s.comm_host = "10.0.0.2";
  s.run_id = step_run_id(42, 3);
  s.plan_path = "/tmp/dtrain-42.3-n2-abc/plan.toml";
  s.plan_digest = "feedbeef";
  s.config.tp = 2;
  s.config.pp = 2;
  s.config.dp = 2;
  for (int r = 0; r < 8; ++r) s.placement.push_back(plan::place_rank(s.config, 4, {}, 0, r));
  s.megatron_args = "--num-layers 4";
  s.topology_summary = "no GPU";
  s.topology_digest = "0123456789abcdef";
  for (int i = 0; i < 4; ++i) {
    s.binding_env.push_back({{"OMP_NUM_THREADS", "2"}, {"CUDA_VISIBLE_DEVICES", std::to_string(i)}});
    s.cpu_lists.push_back(std::to_string(2 * i) + "-" + std::to_string(2 * i + 1));
  }
  return s;
}

TEST(TaskEnvironment, TaskPerRankContract) {
  StepEnvironment s = sample_step();
  auto env = as_map(task_environment(s, 2));
  EXPECT_EQ(env.at("RANK"), "6");  // node 1, local 2, 4 per node
  EXPECT_EQ(env.at("LOCAL_RANK"), "2");
  EXPECT_EQ(env.at("WORLD_SIZE"), "8");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(env.at("MASTER_PORT"), "29517");
  EXPECT_EQ(env.at("DTRAIN_STORE"), "10.0.0.1:29517");
  EXPECT_EQ(env.at("DTRAIN_STORE_TOKEN"), std::string(64, 'a'));
  EXPECT_EQ(env.at("DTRAIN_STORE_HOST"), "0");
  EXPECT_EQ(env.at("DTRAIN_RUN_ID"), "slurm-42.3");
  EXPECT_EQ(env.at("DTRAIN_COMM_HOST"), "10.0.0.2");
  EXPECT_EQ(env.at("DTRAIN_PLAN"), "/tmp/dtrain-42.3-n2-abc/plan.toml");
  EXPECT_EQ(env.at("DTRAIN_PLAN_DIGEST"), "feedbeef");
  EXPECT_EQ(env.at("DTRAIN_TP_SIZE"), "2");
  EXPECT_EQ(env.at("DTRAIN_PP_SIZE"), "2");
  EXPECT_EQ(env.at("DTRAIN_DP_SIZE"), "2");
  EXPECT_EQ(env.at("DTRAIN_FSDP"), "0");
  EXPECT_EQ(env.at("DTRAIN_CP_SIZE"), "1");
  EXPECT_EQ(env.at("DTRAIN_CP_COMM"), "");
  EXPECT_EQ(env.at("DTRAIN_CP_RANK"), "0");
  // rank 6 in tp-dp-pp order: tp = 6 % 2, dp = (6 / 2) % 2, pp = 6 / 4
  EXPECT_EQ(env.at("DTRAIN_TP_RANK"), "0");
  EXPECT_EQ(env.at("DTRAIN_DP_RANK"), "1");
  EXPECT_EQ(env.at("DTRAIN_PP_RANK"), "1");
  EXPECT_EQ(env.at("DTRAIN_MEGATRON_ARGS"), "--num-layers 4");
  EXPECT_EQ(env.at("DTRAIN_NODE_RANK"), "1");
  EXPECT_EQ(env.at("DTRAIN_NNODES"), "2");
  EXPECT_EQ(env.at("DTRAIN_TOPOLOGY"), "no GPU");
  EXPECT_EQ(env.at("DTRAIN_TOPOLOGY_DIGEST"), "0123456789abcdef");
  EXPECT_EQ(env.at("DTRAIN_CPUS"), "4-5");
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "2");
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "2");
  for (const auto& [k, v] : env) {
    EXPECT_NE(std::find(contract_variables().begin(), contract_variables().end(), k), contract_variables().end())
        << k << " is not in contract_variables()";
  }
}

// With context parallelism the cp ranks come right after the tensor-parallel ones (Megatron's order): rank 6 of
// tp=2 cp=2 dp=1 pp=2 is tp 0, cp 1, dp 0, pp 1.
TEST(TaskEnvironment, ContextParallelCoordinates) {
  StepEnvironment s = sample_step();
  s.config.dp = 1;
  s.config.cp = 2;
  s.config.cp_comm = plan::CpComm::kAllGather;
  s.placement.clear();
  for (int r = 0; r < 8; ++r) s.placement.push_back(plan::place_rank(s.config, 4, {}, 0, r));
  auto env = as_map(task_environment(s, 2));
  EXPECT_EQ(env.at("DTRAIN_CP_SIZE"), "2");
  EXPECT_EQ(env.at("DTRAIN_CP_COMM"), "all_gather");
  EXPECT_EQ(env.at("DTRAIN_DP_SIZE"), "1");
  EXPECT_EQ(env.at("DTRAIN_TP_RANK"), "0");
  EXPECT_EQ(env.at("DTRAIN_CP_RANK"), "1");
  EXPECT_EQ(env.at("DTRAIN_DP_RANK"), "0");
  EXPECT_EQ(env.at("DTRAIN_PP_RANK"), "1");
}

TEST(TaskEnvironment, OnlyGlobalRankZeroHostsTheStore) {
  StepEnvironment s = sample_step();
  s.node_index = 0;
  EXPECT_EQ(as_map(task_environment(s, 0)).at("DTRAIN_STORE_HOST"), "1");
  EXPECT_EQ(as_map(task_environment(s, 1)).at("DTRAIN_STORE_HOST"), "0");
}

TEST(TaskEnvironment, DtlaunchPerNodeGetsNoRankOrBinding) {
  StepEnvironment s = sample_step();
  s.shape = step_shape(2, 2, {"dtlaunch", "--nproc-per-node", "4", "--", "dtexec"});
  s.binding_env.clear();
  s.cpu_lists.clear();
  auto env = as_map(task_environment(s, 0));
  EXPECT_EQ(env.count("RANK"), 0u);
  EXPECT_EQ(env.count("LOCAL_RANK"), 0u);
  EXPECT_EQ(env.count("DTRAIN_TP_RANK"), 0u);
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env.at("WORLD_SIZE"), "8");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("DTRAIN_STORE_HOST"), "0");  // dtlaunch on node 0 hosts the store
  EXPECT_EQ(env.at("DTRAIN_TP_SIZE"), "2");
  EXPECT_THROW(task_environment(s, 1), Error);
}

TEST(TaskEnvironment, LocalTaskOutOfRangeIsAnInternalError) {
  StepEnvironment s = sample_step();
  EXPECT_THROW(task_environment(s, 4), Error);
  EXPECT_THROW(task_environment(s, -1), Error);
}

TEST(UsableCpus, TheBindingWithinTheTasksAffinity) {
  EXPECT_EQ(usable_cpus({0, 1, 2, 3, 48, 49}, {0, 1, 48, 96}), (std::vector<int>{0, 1, 48}));
  EXPECT_EQ(usable_cpus({8, 9}, {0, 1}), std::vector<int>{});
  EXPECT_EQ(usable_cpus({}, {0, 1}), std::vector<int>{});
}

TEST(StepPort, SameOnEveryNodeInRangeAndDifferentPerStep) {
  int p = step_port(1234, 0, 30000, 30099);
  EXPECT_EQ(p, step_port(1234, 0, 30000, 30099));
  EXPECT_GE(p, 30000);
  EXPECT_LE(p, 30099);
  EXPECT_NE(p, step_port(1234, 1, 30000, 30099));
  EXPECT_EQ(step_port(7, 7, 31000, 31000), 31000);
  EXPECT_EQ(host_port("fe80::1", 5), "[fe80::1]:5");
  EXPECT_EQ(host_port("10.0.0.1", 5), "10.0.0.1:5");
}

TEST(Binding, FromAnHwlocXmlWithAndWithoutSlurmsAllocation) {
  topology::NodeTopology p4d = topology::load_topology_xml(kTopologies + "aws-p4d.24xlarge.xml");
  StepEnvironment s = sample_step();
  auto bindings = bind_ranks(p4d, 2, "", "", s);
  ASSERT_EQ(bindings.size(), 2u);
  ASSERT_EQ(s.binding_env.size(), 2u);
  EXPECT_EQ(s.binding_env[0].at("CUDA_VISIBLE_DEVICES"), "0");
  EXPECT_EQ(s.binding_env[1].at("CUDA_VISIBLE_DEVICES"), "1");
  EXPECT_EQ(s.binding_env[0].at("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
  EXPECT_FALSE(s.cpu_lists[0].empty());
  // Slurm allocated GPUs 4 and 5, and (device cgroup) renumbered them 0 and 1 for CUDA
  bind_ranks(p4d, 2, "4,5", "0,1", s);
  EXPECT_EQ(bindings[0].gpu, 0);
  EXPECT_EQ(s.binding_env[0].at("CUDA_VISIBLE_DEVICES"), "0");
  EXPECT_EQ(s.binding_env[1].at("CUDA_VISIBLE_DEVICES"), "1");
  auto allocated = bind_ranks(p4d, 2, "4,5", "4,5", s);
  EXPECT_EQ(allocated[0].gpu, 4);
  EXPECT_EQ(s.binding_env[0].at("CUDA_VISIBLE_DEVICES"), "4");
  EXPECT_THROW(bind_ranks(p4d, 9, "", "", s), Error);  // more ranks than GPUs

  topology::NodeTopology ib = topology::load_topology_xml(kTopologies + "hwloc-32em64t-2n8c2t-pci-wholeio.xml");
  bind_ranks(ib, 1, "", "", s);
  EXPECT_EQ(s.binding_env[0].at("NCCL_IB_HCA"), "=mlx5_0:1");
}

TEST(Fingerprint, SummarisesAndDistinguishesTopologies) {
  topology::NodeTopology p4d = topology::load_topology_xml(kTopologies + "aws-p4d.24xlarge.xml");
  topology::NodeTopology dgx2 = topology::load_topology_xml(kTopologies + "hwloc-nvidiaDGX2.xml");
  TopologyFingerprint a = topology_fingerprint(p4d), b = topology_fingerprint(dgx2);
  EXPECT_EQ(a.digest.size(), 16u);
  EXPECT_NE(a.digest, b.digest);
  EXPECT_EQ(a.digest, topology_fingerprint(topology::load_topology_xml(kTopologies + "aws-p4d.24xlarge.xml")).digest);
  EXPECT_THAT(a.summary, HasSubstr("8 x A100-SXM4-40GB"));
  EXPECT_THAT(a.summary, HasSubstr("4 NICs (efa)"));
  EXPECT_THAT(b.summary, HasSubstr("16 x "));
  EXPECT_THAT(b.summary, HasSubstr("no RDMA NIC"));
}

}  // namespace
}  // namespace dtrain::spank
