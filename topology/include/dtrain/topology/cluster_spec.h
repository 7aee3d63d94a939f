// The cluster description (cluster.toml): how many nodes, what is in a node, how fast its links are, and the
// calibration of the cost model for this hardware.
//
// File format (docs/formats.md#cluster-toml):
//   [cluster]  name, nodes
//   [node]     gpus, gpu, nvlink_domain, nvlink_gbps, nics, nic_gbps, pcie_gbps, nic_of_gpu
//   [gpu]      name, tflops_bf16, tflops_fp16, tflops_fp8, tflops_fp32, memory_gib, hbm_gbps   (custom or override)
//   [network]  nvlink_latency_us, network_latency_us, p2p_latency_us, p2p_pipelines_us, [[network.efficiency]] tables
//   [calibration] any field of topology::Calibration
// `dtplan topo --toml` writes the [node] part from a live machine or an hwloc XML.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtrain/topology/gpu_catalog.h"

namespace dtrain {
class TomlDocument;
class TableReader;
}  // namespace dtrain

namespace dtrain::topology {

struct NodeSpec {
  int gpus = 8;
  GpuSpec gpu;
  int nvlink_domain = 8;        // GPUs joined by NVLink/NVSwitch; 1 = PCIe only
  double nvlink_gbps = 300;     // per GPU, per direction, GB/s (the PCIe figure when nvlink_domain = 1)
  int nics = 8;                 // inter-node NICs per node
  double nic_gbps = 25;         // per NIC, per direction, GB/s
  double pcie_gbps = 25;        // GPU <-> host/PCIe switch, per direction, GB/s
  std::vector<int> nic_of_gpu;  // the NIC each GPU uses (rail); default: default_nic_of_gpu
  // A node of CPU ranks: the cores its ranks share (dtplan calibrate writes it). With more ranks than cores the
  // calibrated figures are each rank's share of them with every rank busy; a rank that waits (a pipeline's fill and
  // drain) leaves its share to the others. 0: every rank has its own device.
  int cores = 0;
  // More ranks than cores: the ranks share them (the shared-core terms of the cost model apply).
  bool ranks_share_cores() const { return cores > 0 && gpus > cores; }
  // Inter-node bandwidth available to one GPU when all GPUs of the node communicate at once.
  double network_gbps_per_gpu() const { return nics * nic_gbps / gpus; }
  double node_network_gbps() const { return nics * nic_gbps; }
};

// The NIC (rail) GPU `gpu` of a node of `gpus` GPUs and `nics` NICs uses when [node] nic_of_gpu does not say:
// NIC gpu * nics / gpus, so that consecutive GPUs share a NIC when there are fewer NICs than GPUs. Every default rail
// mapping (placement, fitting a cluster to fewer ranks per node) is this one.
int default_nic_of_gpu(int gpu, int gpus, int nics);

// Collective efficiency: the fraction of nominal bus bandwidth a collective reaches, as a function of message size
// (log-linear interpolation between points), for one scope and, optionally, one group size.
struct EfficiencyCurve {
  std::string scope;          // "nvlink" (inside the NVLink domain) or "network" (across nodes)
  int participants = 0;       // 0 = any group size
  std::vector<double> bytes;  // ascending
  std::vector<double> efficiency;
  double at(double message_bytes) const;
};

struct NetworkSpec {
  // Kept in the unit of the file (microseconds) so that a description written and read back is bit-identical.
  double nvlink_latency_us = 6;    // per step of a ring collective inside the NVLink domain
  double network_latency_us = 10;  // per step across nodes
  double p2p_latency_us = 20;      // one pipeline send/receive, end to end
  // A fixed cost per collective inside a node, whatever its ring steps: the wait for the slowest member where that
  // dominates (CPU ranks sharing cores; fitted by dtplan calibrate's probe). 0 unless given.
  double collective_sync_us = 0;
  double nvlink_latency_s() const { return nvlink_latency_us * 1e-6; }
  double collective_sync_s() const { return collective_sync_us * 1e-6; }
  // More again for a collective whose group holds fewer of the node's ranks than all (CPU ranks sharing cores: the
  // other groups' ranks hold the cores while the group waits for a member); 0 unless given (dtplan calibrate).
  double subgroup_sync_us = 0;
  double subgroup_sync_s() const { return subgroup_sync_us * 1e-6; }
  // More per transfer between pipeline stages for each further pipeline whose ranks share the node's cores (CPU
  // ranks, more than cores: a transfer's partner is more often off its core, running another pipeline's pass); 0
  // unless given (dtplan calibrate).
  double p2p_pipelines_us = 0;
  double p2p_pipelines_s() const { return p2p_pipelines_us * 1e-6; }
  double network_latency_s() const { return network_latency_us * 1e-6; }
  double p2p_latency_s() const { return p2p_latency_us * 1e-6; }
  std::vector<EfficiencyCurve> efficiency;
  // Efficiency for a collective of `participants` members in `scope` moving `message_bytes`: the curve of that scope
  // whose group size is closest (in log scale) to `participants`.
  double efficiency_at(const std::string& scope, int participants, double message_bytes) const;
};

struct ClusterSpec {
  std::string name;
  int nodes = 1;
  NodeSpec node;
  NetworkSpec network;
  std::string source;  // file it came from ("" when built in code)
  // Where figures came from when they were not simply read from a file: key ("node.nvlink_gbps") -> a phrase such as
  // "observed: hwloc NVLinkBandwidth matrix" or "inferred: NVSwitch PCI devices + A100 generation (12 links)".
  std::map<std::string, std::string> provenance;
  // Where keys were written: "node.gpus" -> "cluster.toml:12: [node] gpus = 8" (for errors found against other
  // inputs, such as --gpus not being a multiple of the node size).
  std::map<std::string, std::string> locations;

  int total_gpus() const { return nodes * node.gpus; }
  const Calibration& calibration() const { return node.gpu.calibration; }
};

ClusterSpec default_network(ClusterSpec spec);

// Parses and validates. Throws dtrain::Error (input, exit 2) naming file, line and key.
ClusterSpec load_cluster(const std::string& path);
ClusterSpec parse_cluster(const TomlDocument& doc);
// Parses the cluster tables inside `root` (a whole cluster.toml, or a table of a plan file).
ClusterSpec parse_cluster_tables(TableReader root);
// Every field as TOML under [<prefix>.cluster], [<prefix>.node], ...: what plan files embed; parses back to an
// equal description.
std::string cluster_toml(const ClusterSpec& spec, const std::string& prefix);
// Checks cross-field rules; for specs built in code (from a discovered topology). Throws dtrain::Error (input).
void validate(const ClusterSpec& spec);
// The default collective efficiency tables (docs/cost-model.md#collectives).
std::vector<EfficiencyCurve> default_efficiency_curves();

// The canonical text the cluster digest is taken over; also what `dtplan topo --toml` prints for the node part.
std::string canonical_text(const ClusterSpec& spec);
std::string node_toml(const ClusterSpec& spec);

}  // namespace dtrain::topology
