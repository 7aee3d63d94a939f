// The job layout from the command line and from Slurm's environment: every rule of resolve_job.
#include "dtrain/launch/job_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "dtrain/common/error.h"

namespace dtrain::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

LaunchOptions options(int nproc = 4) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.command = {"dtexec", "train"};
  return o;
}

std::string error_of(const LaunchOptions& o, const Environment& env = {}) {
  try {
    resolve_job(o, env);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kBadInput) << e.what();
    return e.what();
  }
  return "";
}

Environment slurm_step(const std::string& nodelist, int nnodes, int node_id) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_NODELIST", "x[1-9]"},
          {"SLURM_STEP_NODELIST", nodelist},
          {"SLURM_NNODES", "9"},
          {"SLURM_STEP_NUM_NODES", std::to_string(nnodes)},
          {"SLURM_NODEID", std::to_string(node_id)},
          {"SLURM_STEP_NUM_TASKS", std::to_string(nnodes)}};
}

TEST(JobConfig, NprocAloneIsOneMachineOnLoopback) {
  JobConfig j = resolve_job(options(4), {});
  EXPECT_EQ(j.nnodes, 1);
  EXPECT_EQ(j.node_rank, 0);
  EXPECT_EQ(j.world_size, 4);
  EXPECT_TRUE(j.local);
  EXPECT_EQ(j.rdzv_host, "127.0.0.1");
  EXPECT_THAT(j.ports, ElementsAre(0));
  EXPECT_FALSE(j.slurm);
}

TEST(JobConfig, ExplicitNodes) {
  LaunchOptions o = options(8);
  o.nnodes = 4;
  o.node_rank = 2;
  o.rdzv = "10.0.0.1:29400";
  JobConfig j = resolve_job(o, {{"SLURM_JOB_ID", "1"}});  // explicit flags win over Slurm
  EXPECT_EQ(j.nnodes, 4);
  EXPECT_EQ(j.node_rank, 2);
  EXPECT_EQ(j.world_size, 32);
  EXPECT_FALSE(j.local);
  EXPECT_FALSE(j.slurm);
  EXPECT_EQ(j.rdzv_host, "10.0.0.1");
  EXPECT_THAT(j.ports, ElementsAre(29400));
}

TEST(JobConfig, Ipv6Rendezvous) {
  LaunchOptions o = options();
  o.nnodes = 2;
  o.node_rank = 0;
  o.rdzv = "[fe80::1]:1234";
  JobConfig j = resolve_job(o, {});
  EXPECT_EQ(j.rdzv_host, "fe80::1");
  EXPECT_THAT(j.ports, ElementsAre(1234));
}

TEST(JobConfig, UsageErrors) {
  LaunchOptions o = options();
  o.command.clear();
  EXPECT_THAT(error_of(o), HasSubstr("no command to run"));
  EXPECT_THAT(error_of(options(0)), HasSubstr("--nproc-per-node: must be at least 1, not 0"));
  EXPECT_THAT(error_of(options(-4)), HasSubstr("--nproc-per-node: must be at least 1, not -4"));
  o = options();
  o.nnodes = 2;
  o.node_rank = 0;
  EXPECT_THAT(error_of(o), HasSubstr("--nnodes 2 needs --rdzv HOST:PORT"));
  o.rdzv = "host";
  EXPECT_THAT(error_of(o), HasSubstr("give the port too"));
  o.rdzv = "host:0";
  EXPECT_THAT(error_of(o), HasSubstr("the port must be a number from 1 to 65535"));
  o.rdzv = "fe80::1:99";
  EXPECT_THAT(error_of(o), HasSubstr("must be in brackets"));
  o = options();
  o.nnodes = 2;
  o.node_rank = 2;
  o.rdzv = "h:1";
  EXPECT_THAT(error_of(o), HasSubstr("--node-rank 2: expected 0 to 1"));
  o = options();
  o.node_rank = 1;
  EXPECT_THAT(error_of(o), HasSubstr("--node-rank needs --nnodes"));
  o = options();
  o.max_restarts = -1;
  EXPECT_THAT(error_of(o), HasSubstr("--max-restarts: must be at least 0, not -1"));
  o = options();
  o.heartbeat_timeout_s = 0;
  EXPECT_THAT(error_of(o), HasSubstr("--heartbeat-timeout 0"));
}

TEST(JobConfig, SlurmStep) {
  JobConfig j = resolve_job(options(8), slurm_step("gpu[001-003,007]", 4, 2));
  EXPECT_TRUE(j.slurm);
  EXPECT_FALSE(j.local);
  EXPECT_EQ(j.nnodes, 4);
  EXPECT_EQ(j.node_rank, 2);
  EXPECT_EQ(j.world_size, 32);
  EXPECT_EQ(j.rdzv_host, "gpu001");
  EXPECT_THAT(j.rdzv_host_origin, HasSubstr("first host of SLURM_STEP_NODELIST=gpu[001-003,007]"));
  EXPECT_EQ(j.job_id, "slurm-4242.0");
  EXPECT_EQ(j.ports, derived_ports("4242", "0"));
}

TEST(JobConfig, SlurmRendezvousHostOverride) {
  LaunchOptions o = options();
  o.rdzv = "127.0.0.1";
  JobConfig j = resolve_job(o, slurm_step("n[1-2]", 2, 1));
  EXPECT_EQ(j.rdzv_host, "127.0.0.1");
  EXPECT_EQ(j.ports, derived_ports("4242", "0"));
  o.rdzv = "127.0.0.1:5000";
  EXPECT_THAT(resolve_job(o, slurm_step("n[1-2]", 2, 1)).ports, ElementsAre(5000));
}

// Under srun --dtrain-plan the plugin has resolved node 0's address and reserved a port: dtlaunch hosts its store
// there, and an explicit --rdzv still wins.
TEST(JobConfig, SlurmStepUnderTheDtrainPluginUsesItsStore) {
  Environment env = slurm_step("n[1-2]", 2, 1);
  env["DTRAIN_STORE"] = "10.1.2.3:29517";
  JobConfig j = resolve_job(options(), env);
  EXPECT_FALSE(j.local);
  EXPECT_EQ(j.rdzv_host, "10.1.2.3");
  EXPECT_THAT(j.ports, ElementsAre(29517));
  EXPECT_THAT(j.rdzv_host_origin, HasSubstr("DTRAIN_STORE from the dtrain plugin"));
  LaunchOptions o = options();
  o.rdzv = "127.0.0.1";
  EXPECT_EQ(resolve_job(o, env).rdzv_host, "127.0.0.1");
  env["DTRAIN_STORE"] = "fe80::1:99";
  EXPECT_THAT(error_of(options(), env), HasSubstr("DTRAIN_STORE fe80::1:99: an IPv6 address must be in brackets"));
}

TEST(JobConfig, SlurmSingleNodeStaysOnLoopback) {
  JobConfig j = resolve_job(options(), slurm_step("n7", 1, 0));
  EXPECT_TRUE(j.slurm);
  EXPECT_TRUE(j.local);
  EXPECT_EQ(j.rdzv_host, "127.0.0.1");
}

TEST(JobConfig, SlurmErrors) {
  Environment env = slurm_step("n[1-3]", 4, 0);
  EXPECT_THAT(error_of(options(), env),
              HasSubstr("SLURM_STEP_NODELIST=n[1-3] names 3 hosts but SLURM_STEP_NUM_NODES=4"));
  env = slurm_step("n[1-4]", 4, 0);
  env["SLURM_STEP_NUM_TASKS"] = "8";
  EXPECT_THAT(error_of(options(), env), HasSubstr("run one dtlaunch per node (srun --ntasks-per-node=1)"));
  env = slurm_step("n[1-4]", 4, 0);
  env.erase("SLURM_STEP_ID");
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_STEP_NUM_NODES");
  env["SLURM_NNODES"] = "4";
  env["SLURM_JOB_NODELIST"] = "n[1-4]";
  EXPECT_THAT(error_of(options(), env), HasSubstr("outside any job step"));
  env = {{"SLURM_JOB_ID", "1"}};
  EXPECT_THAT(error_of(options(), env), HasSubstr("SLURM_JOB_NODELIST is not"));
  env = slurm_step("n[1-4]", 4, 5);
  EXPECT_THAT(error_of(options(), env), HasSubstr("SLURM_NODEID=5 is not below SLURM_STEP_NUM_NODES=4"));
  env = slurm_step("n[1-4", 4, 0);
  EXPECT_THAT(error_of(options(), env), HasSubstr("hostlist 'n[1-4'"));
}

TEST(JobConfig, DerivedPortsAreStableAndInRange) {
  auto a = derived_ports("4242", "0");
  ASSERT_EQ(a.size(), static_cast<std::size_t>(kPortTries));
  EXPECT_EQ(a, derived_ports("4242", "0"));
  EXPECT_NE(a, derived_ports("4242", "1"));
  EXPECT_NE(a, derived_ports("4243", "0"));
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i], kPortRangeFirst);
    EXPECT_LE(a[i], kPortRangeLast);
    if (i > 0) {
      EXPECT_EQ(a[i], a[i - 1] + 1);
    }
  }
  // Spread: many jobs do not pile onto a few bases.
  std::set<int> bases;
  for (int job = 0; job < 200; ++job) bases.insert(derived_ports(std::to_string(job), "0").front());
  EXPECT_GT(bases.size(), 190u);
}

TEST(JobConfig, ParseRdzv) {
  EXPECT_EQ(parse_rdzv("host:12"), std::make_pair(std::string("host"), std::uint16_t{12}));
  EXPECT_EQ(parse_rdzv("host"), std::make_pair(std::string("host"), std::uint16_t{0}));
  EXPECT_EQ(parse_rdzv("[::1]:7"), std::make_pair(std::string("::1"), std::uint16_t{7}));
  EXPECT_EQ(parse_rdzv("[::1]"), std::make_pair(std::string("::1"), std::uint16_t{0}));
  EXPECT_THROW(parse_rdzv(":12"), Error);
  EXPECT_THROW(parse_rdzv("h:"), Error);
  EXPECT_THROW(parse_rdzv("h:x"), Error);
}

}  // namespace
}  // namespace dtrain::launch
