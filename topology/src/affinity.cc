// Names of the affinity classes, as nvidia-smi topo -m prints them.
#include "dtrain/topology/affinity.h"

#include <fmt/format.h>

namespace dtrain::topology {

std::string_view to_string(Affinity affinity) {
  switch (affinity) {
    case Affinity::kSelf:
      return "X";
    case Affinity::kNvlink:
      return "NV";
    case Affinity::kPix:
      return "PIX";
    case Affinity::kPxb:
      return "PXB";
    case Affinity::kPhb:
      return "PHB";
    case Affinity::kNode:
      return "NODE";
    case Affinity::kSys:
      return "SYS";
  }
  return "SYS";
}

std::string label(const Link& link) {
  if (link.affinity == Affinity::kNvlink) return fmt::format("NV{}", link.nvlinks);
  return std::string(to_string(link.affinity));
}

std::string_view describe(Affinity affinity) {
  switch (affinity) {
    case Affinity::kSelf:
      return "Self";
    case Affinity::kNvlink:
      return "Connection traversing a bonded set of # NVLinks";
    case Affinity::kPix:
      return "Connection traversing at most a single PCIe bridge";
    case Affinity::kPxb:
      return "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)";
    case Affinity::kPhb:
      return "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)";
    case Affinity::kNode:
      return "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node";
    case Affinity::kSys:
      return "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)";
  }
  return "";
}

}  // namespace dtrain::topology
