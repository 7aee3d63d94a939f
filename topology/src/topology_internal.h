// Pieces of node discovery shared by the source files of dtrain::topology; not part of the public interface.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/topology/node_topology.h"
#include "dtrain/topology/nvml.h"

namespace dtrain::topology::detail {

// What a GPU generation brings to an NVSwitch board. Sources: NVIDIA DGX-2 (V100: 6 NVLink2 links per GPU, one to
// each of the six NVSwitches of its baseboard), DGX/HGX A100 (12 NVLink3 links per GPU into six NVSwitches),
// DGX/HGX H100 and H200 (18 NVLink4 links per GPU into four NVSwitches). Every one of these links carries 25 GB/s per
// direction (hwloc's NVML backend uses the same figure for NVLink 2 to 4, 20 GB/s for NVLink 1).
struct NvlinkGeneration {
  std::string_view family;  // "V100", "A100", "H100", "H200"
  int version = 0;          // NVLink generation
  double link_gbps = 0;     // per link, per direction
  int switch_links = 0;     // links per GPU on an NVSwitch board
};
std::optional<NvlinkGeneration> nvlink_generation(const Gpu& gpu);

// Per-link bandwidth for the version NVML reports. NVML has reported the generation (1..4) and, in newer drivers,
// an enum (NVLINK_VERSION_2_0 = 2, 2_2 = 3, 3_0 = 4, 3_1 = 5, 4_0 = 6, 5_0 = 7), so only 1 (20 GB/s) and 7
// (NVLink5, 50 GB/s) are unambiguous; every value in between means 25 GB/s in both readings. 0 for unknown values.
double nvlink_link_gbps_for_version(int version);

// Direct NVLink links between GPUs and links from each GPU to NVSwitches, however they were found.
struct NvlinkGraph {
  std::vector<std::vector<int>> direct;  // [gpu][gpu] links
  std::vector<int> to_switch;            // [gpu] links ending on an NVSwitch
  std::vector<double> link_gbps;         // [gpu] per-link bandwidth used
  std::vector<int> version;              // [gpu] NVLink generation, 0 when unknown
  NvlinkSource source = NvlinkSource::kNone;
  bool empty() const;
};
NvlinkGraph make_nvlink_graph(int gpus);

// NVLink from NVML's per-link answers (live machine). GPUs are matched by PCI bus id; a link whose far end is not one
// of the node's GPUs ends on an NVSwitch.
NvlinkGraph nvlink_from_nvml(const NodeTopology& node, const NvmlReport& nvml);
// NVLink inferred from NVSwitch PCI devices and the GPU generation; empty when there is no NVSwitch or the GPUs are
// of an unknown or mixed generation.
NvlinkGraph infer_nvlink(const NodeTopology& node);
// Writes each GPU's GpuNvlink and overrides gpu_gpu with NV# for every NVLink-connected pair. GPUs that both reach
// NVSwitches are connected: hwloc and NVML see only the GPU side of the switches, never the switch-to-switch trunks
// (the DGX-2 joins its two baseboards with them), and every NVSwitch system joins all of its GPUs.
void apply_nvlink(NodeTopology& node, const NvlinkGraph& graph);

// NIC helpers.
NicKind nic_kind(std::string_view name, unsigned vendor_id, unsigned pci_class, const std::vector<std::string>& netdevs,
                 std::string_view link_layer);
// The nominal rate of a known RDMA NIC from its PCI id, with the reason; nullopt when the id is unknown.
struct NicRate {
  double gbps = 0;
  std::string why;
};
std::optional<NicRate> nominal_nic_rate(unsigned vendor_id, unsigned device_id);
// Link rate from sysfs ("200 Gb/sec (4X HDR)") in GB/s per direction; 0 when it does not parse.
double parse_sysfs_rate_gbps(std::string_view rate_text);
// Reads ports, states, rates and link layer of an RDMA device from /sys/class/infiniband/<name>; returns false when
// the directory does not exist. `link_layer` gets the first port's link layer ("InfiniBand", "Ethernet").
bool read_sysfs_nic(const std::string& sysfs_root, Nic& nic, std::string& link_layer);

// Catalog matching for a GPU: the catalog entry for its model name, else for its PCI id ("10de:20b0"); "" if none.
std::string match_catalog(const Gpu& gpu);

// Fills node.anomalies from the rest of the node.
void find_anomalies(NodeTopology& node);

// Whole file contents with trailing whitespace removed; nullopt when it cannot be read.
std::optional<std::string> read_text_file(const std::string& path);

}  // namespace dtrain::topology::detail
