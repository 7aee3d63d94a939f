// A cluster.toml written by dtplan calibrate on CPUs: its [provenance] block names where each measured figure came
// from, which dtplan explain prints beside it; a figure the calibration did not fit gets no such line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "dtrain/common/error.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::topology {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A 4-rank CPU calibration's file with the executor probe's figures; `provenance_extra` ends its [provenance] block.
std::string calibrated(const std::string& provenance_extra) {
  return R"(format = 1
[cluster]
name = "vm"
nodes = 1
[node]
gpus = 4
gpu = "cpu"
nvlink_domain = 4
nvlink_gbps = 0.98
nics = 0
cores = 2
[gpu]
name = "cpu"
tflops_fp32 = 0.13
memory_gib = 4
hbm_gbps = 30
[network]
collective_sync_us = 1700
nvlink_latency_us = 850
subgroup_sync_us = 400
p2p_latency_us = 848
p2p_pipelines_us = 2400
[calibration]
hbm_efficiency = 0.6
idle_core_reclaim = 0.3
attention_seq = [256, 512, 1024]
attention_forward_efficiency = [0.67, 0.94, 1.1]
attention_backward_efficiency = [1.02, 1.29, 1.41]
[provenance]
host = "vm"
device = "cpu"
date = "2026-11-27T07:00:00Z"
duration_s = 48
ranks_per_node = 4
probe_step_s = 0.1
)" + provenance_extra;
}

ClusterSpec parsed(const std::string& text) { return parse_cluster(TomlDocument::parse_string(text, "cal4.toml")); }

TEST(CalibrationProvenance, TheProbesFiguresNameTheRunsTheyWereFittedTo) {
  const ClusterSpec c = parsed(calibrated("all_reduce_gbps = 1.7\nprobe_dp_collectives_s = 0.011\n"));
  const std::string measured = "measured: dtplan calibrate on vm (cpu, 2026-11-27T07:00:00Z, 48 s), executor probe";
  EXPECT_EQ(c.provenance.at("node.nvlink_gbps"),
            measured +
                ", a data-parallel run's gradient collectives (11.00 ms per step; the all-reduce alone: 1.70 "
                "GB/s)");
  EXPECT_EQ(c.provenance.at("network.collective_sync_us"), measured + ", tensor-parallel runs");
  EXPECT_EQ(c.provenance.at("network.nvlink_latency_us"), measured + ", tensor-parallel runs");
  EXPECT_EQ(c.provenance.at("network.subgroup_sync_us"), measured + ", groups of 2");
  EXPECT_EQ(c.provenance.at("calibration.idle_core_reclaim"), measured + ", a pipeline run's compute");
  EXPECT_EQ(c.provenance.at("network.p2p_latency_us"), measured + ", one pipeline's step");
  EXPECT_EQ(c.provenance.at("network.p2p_pipelines_us"), measured + ", several pipelines' step");
  EXPECT_EQ(c.provenance.at("calibration.hbm_efficiency"), measured);
  const std::string kernels = "measured: dtplan calibrate on vm (cpu, 2026-11-27T07:00:00Z, 48 s)";
  EXPECT_EQ(c.provenance.at("calibration.attention_forward_efficiency"), kernels + ", at 256, 512, 1024 tokens");
  EXPECT_EQ(c.provenance.at("calibration.attention_backward_efficiency"), kernels + ", at 256, 512, 1024 tokens");
  EXPECT_DOUBLE_EQ(c.node.nvlink_gbps, 0.98);
}

// --quick (no data-parallel run): the bandwidth is the all-reduce microbenchmark's, and says so.
TEST(CalibrationProvenance, WithoutTheDataParallelRunTheBandwidthIsTheAllReduces) {
  const ClusterSpec c = parsed(calibrated("all_reduce_gbps = 1.7\n"));
  EXPECT_THAT(c.provenance.at("node.nvlink_gbps"), StartsWith("measured: dtplan calibrate on vm"));
  EXPECT_THAT(c.provenance.at("node.nvlink_gbps"), HasSubstr(", all-reduce between the ranks"));
  EXPECT_THAT(c.provenance.at("node.nvlink_gbps"), ::testing::Not(HasSubstr("data-parallel")));
}

// One rank (no all-reduce measured) or a file from before these keys: no line for the bandwidth, which is the base's.
TEST(CalibrationProvenance, ABandwidthNotMeasuredHasNoLine) {
  EXPECT_EQ(parsed(calibrated("")).provenance.count("node.nvlink_gbps"), 0u);
  EXPECT_THROW(parsed(calibrated("all_reduce_gbps = \"fast\"\n")), Error);
}

}  // namespace
}  // namespace dtrain::topology
