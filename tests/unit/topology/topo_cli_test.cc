// `dtplan topo` end to end: golden outputs on the XML fixtures (tests/data/topologies/golden/, regenerate with
// DTRAIN_UPDATE_GOLDEN=1), the JSON twin field by field, this machine, and the exit codes of bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "topology_test_support.h"

namespace dtrain::topology {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;

const std::string kSource = DTRAIN_SOURCE_DIR;
const std::string kDtplan = std::string(DTRAIN_BINARY_DIR) + "/bin/dtplan";

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Outcome {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs `dtplan topo <args>` from the source directory, so that fixture paths in the output are relative and the
// goldens do not depend on where the tree is checked out.
Outcome dtplan_topo(const std::string& args) {
  char out_path[] = "/tmp/dtplan-topo-out-XXXXXX";
  char err_path[] = "/tmp/dtplan-topo-err-XXXXXX";
  int fo = mkstemp(out_path), fe = mkstemp(err_path);
  close(fo);
  close(fe);
  std::string cmd = "cd '" + kSource + "' && '" + kDtplan + "' topo " + args + " >" + out_path + " 2>" + err_path;
  int status = std::system(cmd.c_str());
  Outcome r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  unlink(out_path);
  unlink(err_path);
  return r;
}

std::string xml(const std::string& name) { return "--xml tests/data/topologies/" + name; }

void expect_golden(const std::string& args, const std::string& golden) {
  Outcome r = dtplan_topo(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::string path = kSource + "/tests/data/topologies/golden/" + golden;
  if (std::getenv("DTRAIN_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(path) << r.out;
    return;
  }
  EXPECT_EQ(r.out, slurp(path)) << "dtplan topo " << args << " differs from " << path
                                << " (DTRAIN_UPDATE_GOLDEN=1 rewrites it after a deliberate change)";
}

TEST(TopoCli, GoldenSummaries) {
  expect_golden(xml(testing::kDgx2), "dgx2.summary.txt");
  expect_golden(xml(testing::kP4d), "p4d.summary.txt");
  expect_golden(xml(testing::kWholeIo), "wholeio.summary.txt");
  expect_golden(xml(testing::k24em64t), "24em64t.summary.txt");
}

TEST(TopoCli, GoldenMatrices) {
  expect_golden("--matrix " + xml(testing::kDgx2), "dgx2.matrix.txt");
  expect_golden("--matrix " + xml(testing::kP4d), "p4d.matrix.txt");
  expect_golden("--matrix " + xml(testing::kWholeIo), "wholeio.matrix.txt");
  expect_golden("--matrix " + xml(testing::k24em64t), "24em64t.matrix.txt");
}

TEST(TopoCli, GoldenToml) {
  expect_golden("--toml " + xml(testing::kDgx2), "dgx2.toml");
  expect_golden("--toml " + xml(testing::kP4d), "p4d.toml");
}

TEST(TopoCli, JsonP4d) {
  Outcome r = dtplan_topo("--json " + xml(testing::kP4d));
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["format"], 1);
  EXPECT_EQ(j["source"], "xml");
  EXPECT_EQ(j["path"], "tests/data/topologies/aws-p4d.24xlarge.xml");
  EXPECT_EQ(j["numa_nodes"], 2);
  EXPECT_EQ(j["cores"], 48);
  EXPECT_EQ(j["pus"], 96);
  ASSERT_EQ(j["gpus"].size(), 8u);
  const json& g = j["gpus"][0];
  EXPECT_EQ(g["index"], 0);
  EXPECT_EQ(g["pci_bus_id"], "0000:10:1c.0");
  EXPECT_EQ(g["model"], "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(g["catalog"], "A100-SXM4-40GB");
  EXPECT_EQ(g["memory_bytes"], 41410944ULL * 1024);
  EXPECT_EQ(g["numa"], 0);
  EXPECT_EQ(g["nvlink"]["links"], 12);
  EXPECT_EQ(g["nvlink"]["gbps"], 300.0);
  EXPECT_EQ(g["nvlink"]["source"], "inferred");
  EXPECT_EQ(j["nvswitches"].size(), 6u);
  ASSERT_EQ(j["nics"].size(), 4u);
  const json& n = j["nics"][2];
  EXPECT_EQ(n["name"], "rdmap144s27");
  EXPECT_EQ(n["kind"], "efa");
  EXPECT_EQ(n["state"], "active");
  EXPECT_EQ(n["gbps"], 12.5);
  EXPECT_EQ(n["numa"], 1);
  EXPECT_EQ(n["pci_bus_id"], "0000:90:1b.0");
  EXPECT_EQ(j["affinity"]["gpu_gpu"][0][0], "X");
  EXPECT_EQ(j["affinity"]["gpu_gpu"][0][7], "NV12");
  EXPECT_EQ(j["affinity"]["gpu_nic"][4][2], "PIX");
  EXPECT_EQ(j["affinity"]["gpu_nic"][4][0], "SYS");
  EXPECT_TRUE(j["anomalies"].empty());
}

TEST(TopoCli, JsonDgx2) {
  Outcome r = dtplan_topo("--json " + xml(testing::kDgx2));
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  ASSERT_EQ(j["gpus"].size(), 16u);
  for (const auto& g : j["gpus"]) {
    EXPECT_EQ(g["model"], "Tesla V100-SXM3-32GB-H");
    EXPECT_EQ(g["memory_bytes"], 32ULL << 30);
    EXPECT_EQ(g["nvlink"]["links"], 6);
    EXPECT_EQ(g["nvlink"]["gbps"], 150.0);
    EXPECT_EQ(g["nvlink"]["source"], "hwloc");
  }
  EXPECT_EQ(j["nvswitches"].size(), 12u);
  EXPECT_TRUE(j["nics"].empty());
  EXPECT_EQ(j["affinity"]["gpu_gpu"][0][15], "NV6");
  ASSERT_EQ(j["anomalies"].size(), 1u);
  EXPECT_EQ(j["anomalies"][0]["kind"], "no_rdma_nic");
}

TEST(TopoCli, JsonWholeIoAnd24em64t) {
  Outcome r = dtplan_topo("--json " + xml(testing::kWholeIo));
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  ASSERT_EQ(j["gpus"].size(), 1u);
  EXPECT_EQ(j["gpus"][0]["os_devices"][0], "cuda0");
  EXPECT_EQ(j["gpus"][0]["nvlink"]["source"], "none");
  EXPECT_EQ(j["nics"][0]["name"], "mlx5_0");
  EXPECT_EQ(j["nics"][0]["state"], "active");
  EXPECT_EQ(j["nics"][0]["port"], 1);
  EXPECT_EQ(j["affinity"]["gpu_nic"][0][0], "PIX");

  r = dtplan_topo("--json " + xml(testing::k24em64t));
  ASSERT_EQ(r.code, 0) << r.err;
  j = json::parse(r.out);
  EXPECT_TRUE(j["gpus"].empty());
  EXPECT_EQ(j["nics"][0]["name"], "mlx4_0");
  EXPECT_EQ(j["nics"][0]["gbps"], nullptr);
}

TEST(TopoCli, ThisMachine) {
  testing::SysfsFacts facts = testing::sysfs_facts();
  Outcome r = dtplan_topo("");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(std::to_string(facts.numa_nodes) + " NUMA node(s), " + std::to_string(facts.cores) +
                               " core(s)"));
  if (facts.nvidia_gpus == 0) {
    EXPECT_THAT(r.out, HasSubstr("\nGPUs: none\n"));
  }
  r = dtplan_topo("--json");
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["source"], "live");
  EXPECT_EQ(j["numa_nodes"], facts.numa_nodes);
  EXPECT_EQ(j["cores"], facts.cores);
  EXPECT_EQ(j["pus"], facts.pus);
  if (facts.nvidia_gpus == 0) {
    EXPECT_TRUE(j["gpus"].empty());
    EXPECT_EQ(j["nvml"]["available"], false);
  }
  EXPECT_EQ(dtplan_topo("--matrix").code, 0);
}

void expect_bad_input(const std::string& args, const std::string& message) {
  Outcome r = dtplan_topo(args);
  EXPECT_EQ(r.code, 2) << args;
  EXPECT_EQ(r.out, "") << args;
  EXPECT_THAT(r.err, StartsWith("dtplan: ")) << args;
  EXPECT_THAT(r.err, HasSubstr(message)) << args;
}

TEST(TopoCli, BadInputExitsWithTwoAndSaysWhatToDo) {
  expect_bad_input(xml("bad/missing.xml"), "bad/missing.xml: no such file; give the path of an hwloc XML topology");
  expect_bad_input(xml("bad/not-xml.xml"), "not-xml.xml: is not XML");
  expect_bad_input(xml("bad/hwloc3.xml"), "--export-xml-flags v2");
  expect_bad_input(xml("bad/no-io.xml"), "has no I/O objects");
}

TEST(TopoCli, BadUsageExitsWithTwo) {
  for (const std::string args : {"--xml", "--json --toml", "--matrix --json", "--no-such-flag"}) {
    Outcome r = dtplan_topo(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_FALSE(r.err.empty()) << args;
  }
}

TEST(TopoCli, TomlNeedsAGpuInTheCatalog) {
  expect_bad_input("--toml " + xml(testing::k24em64t), "has no NVIDIA GPU");
  expect_bad_input("--toml " + xml(testing::kWholeIo), "\"Tesla K40m\"");
}

}  // namespace
}  // namespace dtrain::topology
