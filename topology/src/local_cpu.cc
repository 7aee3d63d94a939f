#include "dtrain/topology/local_cpu.h"

namespace dtrain::topology {

// The figures and the reasons for them are in examples/clusters/local-cpu.toml.
ClusterSpec local_cpu_cluster(int ranks) {
  ClusterSpec c;
  c.name = "local-cpu";
  c.nodes = 1;
  c.node.gpus = ranks;
  c.node.gpu.name = "cpu";
  c.node.gpu.tflops_fp32 = 0.05;
  c.node.gpu.tflops_bf16 = 0.05;  // bf16 GEMMs run on the fp32 kernels
  c.node.gpu.tflops_fp8 = 0.05;   // and so do the emulated FP8 GEMMs ([training] fp8)
  c.node.gpu.memory_gib = 4;
  c.node.gpu.hbm_gbps = 10;
  c.node.gpu.calibration.gemm_efficiency_max = 0.8;
  c.node.gpu.calibration.gemm_half_gflop = 0.01;
  c.node.gpu.calibration.fp8_gemm_efficiency = 1.0;
  c.node.gpu.calibration.attention_efficiency = 0.3;
  c.node.gpu.calibration.hbm_efficiency = 0.5;
  c.node.gpu.calibration.step_overhead_s = 0.005;
  c.node.gpu.calibration.microbatch_overhead_s = 0.0005;
  c.node.gpu.calibration.runtime_reserved_gib = 0.1;
  c.node.nvlink_domain = ranks;
  c.node.nvlink_gbps = 2;
  c.node.nics = 1;
  c.node.nic_gbps = 1;
  c.node.pcie_gbps = 2;
  c.network.nvlink_latency_us = 50;
  c.network.network_latency_us = 100;
  c.network.p2p_latency_us = 50;
  return default_network(c);
}

}  // namespace dtrain::topology
