// NodeTopology: what one node holds and how it is wired — CPU packages, NUMA nodes, cores and PUs; NVIDIA GPUs with
// their NVLink links; NVSwitches; RDMA NICs (InfiniBand, RoCE, EFA); the affinity class of every GPU/NIC pair; and
// the anomalies worth a warning before a job runs on it.
//
// Two sources, one result:
//   - the live machine: hwloc with every I/O object kept, plus NVML loaded at run time (dlopen of
//     libnvidia-ml.so.1, see nvml.h) for GPU names, memory and NVLink, plus sysfs for NIC link rates;
//   - an hwloc XML file (`lstopo --whole-io --of xml node.xml` on the node; hwloc 1.x and 2.x formats).
//
// Where each figure came from is kept next to it (GpuNvlink::source, Gpu::model_source, Nic::gbps_source), so that
// reports and the cluster description can say which numbers were observed and which inferred.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/topology/affinity.h"

namespace dtrain::topology {

// Where a GPU's NVLink figures come from.
//   kHwloc:    the "NVLinkBandwidth" distances matrix of the topology (an XML written by an NVML-enabled lstopo);
//   kNvml:     NVML queried on the live machine (link state, version, remote end of every link);
//   kInferred: NVSwitch PCI devices on the node plus the GPU generation (A100: 12 links, H100/H200: 18, V100: 6);
//   kNone:     no NVLink known; the GPU talks to its peers over PCIe.
enum class NvlinkSource { kNone, kHwloc, kNvml, kInferred };
std::string_view to_string(NvlinkSource source);  // "none", "hwloc", "nvml", "inferred"

struct GpuNvlink {
  int links = 0;         // active NVLink links of this GPU, to peer GPUs and to NVSwitches together
  int switch_links = 0;  // of `links`, those that end on an NVSwitch
  double link_gbps = 0;  // one link, one direction, GB/s (20 for NVLink1, 25 for NVLink2-4, 50 for NVLink5)
  double gbps = 0;       // all links of this GPU, one direction, GB/s
  int version = 0;       // NVLink generation when known (2 = V100, 3 = A100, 4 = H100/H200), else 0
  NvlinkSource source = NvlinkSource::kNone;
};

struct NumaNode {
  int os_index = 0;       // the Linux NUMA node number
  std::vector<int> cpus;  // PUs (Linux CPU numbers) local to it
  std::uint64_t memory_bytes = 0;
};

struct Core {
  int index = 0;         // logical index, 0..cores-1, in hwloc order (package, then core)
  int package = 0;       // logical index of its CPU package
  int numa = -1;         // NUMA node os index, -1 when unknown
  std::vector<int> pus;  // its hardware threads (Linux CPU numbers)
};

struct Gpu {
  int index = 0;             // 0..gpus-1 in PCI bus order: nvidia-smi's index, CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID
  std::string pci_bus_id;    // "0000:10:1c.0"
  unsigned vendor_id = 0;    // 0x10de
  unsigned device_id = 0;    // 0x20b0 (A100-SXM4-40GB), 0x2330 (H100 SXM5), ...
  std::string model;         // as the driver names it ("NVIDIA A100-SXM4-40GB"), else the PCI name
  std::string model_source;  // "nvml", "cuda", "opencl", "pci id", "pci name"
  std::string catalog_name;  // the GPU catalog entry it matches (gpu_catalog.h), "" when none
  std::uint64_t memory_bytes = 0;       // 0 when unknown
  std::string memory_source;            // "nvml", "cuda", "opencl", "catalog", "" when unknown
  int numa = -1;                        // NUMA node os index, -1 when unknown
  std::vector<int> local_cpus;          // PUs close to the GPU (its NUMA node or package)
  double pcie_gbps = 0;                 // PCIe link, one direction, GB/s (hwloc's link speed), 0 when unknown
  std::vector<std::string> os_devices;  // cuda0, nvml0, card0, renderD128, ...
  GpuNvlink nvlink;
};

struct NvSwitch {
  std::string pci_bus_id;
  unsigned device_id = 0;  // 0x1ac2 (V100 generation), 0x1af1 (A100), 0x22a3 (H100)
  int numa = -1;
};

enum class NicKind { kInfiniBand, kRoce, kEfa, kRdma };
std::string_view to_string(NicKind kind);  // "infiniband", "roce", "efa", "rdma" (a verbs device of unknown kind)

struct NicPort {
  int number = 1;
  int state = 0;          // InfiniBand port state: 1 down, 2 init, 3 armed, 4 active, 5 active-defer; 0 unknown
  double gbps = 0;        // link rate, one direction, GB/s (sysfs on a live machine), 0 when unknown
  std::string rate_text;  // as sysfs prints it: "200 Gb/sec (4X HDR)"
};

struct Nic {
  std::string name;  // the RDMA device: mlx5_0, rdmap16s27, efa_0
  NicKind kind = NicKind::kRdma;
  std::vector<std::string> netdevs;  // network interfaces of the same PCI function: ib0, ens32
  std::string pci_bus_id;
  unsigned vendor_id = 0;
  unsigned device_id = 0;
  int numa = -1;
  std::vector<int> local_cpus;
  std::vector<NicPort> ports;  // empty when the topology says nothing about ports
  double gbps = 0;             // rate of its best active port, one direction, GB/s; 0 when unknown
  std::string gbps_source;     // "sysfs", "inferred: <why>", "" when unknown

  // True when a port is active, or when nothing is known about the ports (an XML without port infos).
  bool usable() const;
  // The number of the first active port, else of the first port, else 1.
  int port() const;
  // "active", "down", "init", "armed", "unknown": the state of the best port.
  std::string state_name() const;
};

// Something worth a warning before a job runs on the node. `kind` is one of:
//   nvlink_degraded         a GPU has fewer active NVLinks than its peers
//   nic_port_down           a NIC has no active port
//   gpu_without_local_nic   a GPU has no NIC on its NUMA node (its inter-node traffic crosses the socket link)
//   mixed_gpu_models        GPUs of different models on one node
//   no_rdma_nic             a GPU node without any InfiniBand/RoCE/EFA NIC (inter-node traffic over TCP)
struct Anomaly {
  std::string kind;
  std::string message;
};

struct NodeTopology {
  std::string source;    // "live" or "xml"
  std::string path;      // the XML file; "" for the live machine
  std::string machine;   // DMI product name ("p4d.24xlarge", "NVIDIA DGX-2H"); may be ""
  std::string hostname;  // as hwloc recorded it; may be ""
  std::string
      hwloc_version;  // the hwloc that discovered it: the library in use, or the XML's writer ("" if unrecorded)

  int packages = 0;
  std::vector<NumaNode> numa_nodes;
  std::vector<Core> cores;
  int pus = 0;

  std::vector<Gpu> gpus;
  std::vector<NvSwitch> nvswitches;
  std::vector<Nic> nics;

  // Pairwise affinity, indexed by position in `gpus` and `nics`. The diagonals of gpu_gpu and nic_nic are kSelf.
  std::vector<std::vector<Link>> gpu_gpu;
  std::vector<std::vector<Affinity>> gpu_nic;
  std::vector<std::vector<Affinity>> nic_nic;

  // NVML on the live machine: whether it could be used, and why not.
  bool nvml_available = false;
  std::string nvml_status;

  std::vector<Anomaly> anomalies;
  // Facts a reader should know that are not anomalies: devices left out and why, figures corrected, NVML absent.
  std::vector<std::string> notes;

  int numa_count() const { return static_cast<int>(numa_nodes.size()); }
  int core_count() const { return static_cast<int>(cores.size()); }
  int gpu_count() const { return static_cast<int>(gpus.size()); }
};

// The live machine. Throws dtrain::Error (topology) when hwloc cannot load it; a missing NVIDIA driver or NVML is
// not an error (the GPUs then come from PCI, and nvml_status says why NVML was not used).
NodeTopology discover_node();

// An hwloc XML file. Throws dtrain::Error (input, exit 2) with what is wrong and what to do when the file is missing,
// is not XML, is not an hwloc topology, was written by hwloc 3.x (format 3.0, which hwloc 2.x cannot read), or has no
// I/O objects (exported with --no-io, so no GPU or NIC could be seen).
NodeTopology load_topology_xml(const std::string& path);

// load_topology_xml(xml_path), or discover_node() when xml_path is empty.
NodeTopology load_node_topology(const std::string& xml_path);

// "0000:10:1c.0" from PCI domain, bus, device, function.
std::string format_pci_bus_id(unsigned domain, unsigned bus, unsigned device, unsigned function);
// Canonical form of a PCI bus id as NVML or sysfs print it ("00000000:10:1C.0" -> "0000:10:1c.0"); the input
// unchanged when it does not parse.
std::string normalize_pci_bus_id(std::string_view bus_id);

}  // namespace dtrain::topology
