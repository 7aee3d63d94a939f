// Affinity: how close two devices of a node are (GPU-GPU, GPU-NIC, NIC-NIC), in the classes `nvidia-smi topo -m`
// prints and NCCL uses to pick paths. From closest to farthest:
//
//   NV#   NVLink: # links joined directly or through the node's NVSwitches
//   PIX   at most one PCIe switch between them
//   PXB   several PCIe bridges, not through the host bridge
//   PHB   through a PCIe host bridge (the CPU's root complex)
//   NODE  across host bridges within one NUMA node
//   SYS   across NUMA nodes (the socket interconnect: UPI, xGMI)
#pragma once

#include <string>
#include <string_view>

namespace dtrain::topology {

// Ordered from closest to farthest, so `a < b` means "a is closer than b". kSelf is a device with itself.
enum class Affinity { kSelf, kNvlink, kPix, kPxb, kPhb, kNode, kSys };

// The connection between two devices: its class and, for kNvlink, how many NVLink links the pair uses.
struct Link {
  Affinity affinity = Affinity::kSys;
  int nvlinks = 0;  // links of the bonded set (nvidia-smi's NV#); 0 unless affinity == kNvlink
};

// "X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS".
std::string_view to_string(Affinity affinity);

// The label nvidia-smi topo -m prints for a link: "X", "NV12", "PIX", ...
std::string label(const Link& link);

// The one-line meaning of a class, as in nvidia-smi's legend.
std::string_view describe(Affinity affinity);

}  // namespace dtrain::topology
