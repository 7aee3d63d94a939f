// Names and small helpers of the node topology model, and the anomaly checks.
#include "dtrain/topology/node_topology.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "dtrain/common/strings.h"
#include "topology_internal.h"

namespace dtrain::topology {

std::string_view to_string(NvlinkSource source) {
  switch (source) {
    case NvlinkSource::kNone:
      return "none";
    case NvlinkSource::kHwloc:
      return "hwloc";
    case NvlinkSource::kNvml:
      return "nvml";
    case NvlinkSource::kInferred:
      return "inferred";
  }
  return "none";
}

std::string format_pci_bus_id(unsigned domain, unsigned bus, unsigned device, unsigned function) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, device, function);
}

std::string normalize_pci_bus_id(std::string_view bus_id) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  std::string text(bus_id);
  char tail = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) == 4) {
    return format_pci_bus_id(domain, bus, device, function);
  }
  if (std::sscanf(text.c_str(), "%x:%x.%x%c", &bus, &device, &function, &tail) == 3) {
    return format_pci_bus_id(0, bus, device, function);
  }
  return text;
}

namespace detail {

void find_anomalies(NodeTopology& node) {
  auto& out = node.anomalies;
  // NVLink: only observed figures can reveal a broken link; inferred ones are uniform by construction.
  int max_links = 0;
  for (const auto& g : node.gpus) {
    if (g.nvlink.source == NvlinkSource::kHwloc || g.nvlink.source == NvlinkSource::kNvml) {
      max_links = std::max(max_links, g.nvlink.links);
    }
  }
  bool observed = std::any_of(node.gpus.begin(), node.gpus.end(), [](const Gpu& g) {
    return g.nvlink.source == NvlinkSource::kHwloc || g.nvlink.source == NvlinkSource::kNvml;
  });
  if (observed) {
    for (const auto& g : node.gpus) {
      if (g.nvlink.links < max_links) {
        out.push_back({"nvlink_degraded",
                       fmt::format("GPU{} ({}) has {} active NVLink links where its peers have {}: a link is down or "
                                   "was not trained, and collectives through this GPU slow down (check `nvidia-smi "
                                   "nvlink --status`)",
                                   g.index, g.pci_bus_id, g.nvlink.links, max_links)});
      }
    }
  }
  for (const auto& n : node.nics) {
    if (n.usable()) continue;
    out.push_back(
        {"nic_port_down",
         fmt::format("NIC {} ({}) has no active port (state {}): its GPUs fall back to a farther NIC "
                     "(check the cable and `ibstat {}`)",
                     n.name, n.pci_bus_id.empty() ? "no PCI address" : n.pci_bus_id, n.state_name(), n.name)});
  }
  if (!node.gpus.empty() && node.nics.empty()) {
    out.push_back({"no_rdma_nic",
                   "no InfiniBand, RoCE or EFA NIC on this GPU node: traffic between nodes would go over TCP "
                   "sockets, far slower than NCCL over RDMA"});
  }
  if (!node.nics.empty()) {
    for (const auto& g : node.gpus) {
      if (g.numa < 0) continue;
      bool local =
          std::any_of(node.nics.begin(), node.nics.end(), [&](const Nic& n) { return n.numa == g.numa && n.usable(); });
      if (!local) {
        out.push_back({"gpu_without_local_nic",
                       fmt::format("GPU{} ({}) on NUMA node {} has no usable NIC on its NUMA node: its traffic to "
                                   "other nodes crosses the socket interconnect",
                                   g.index, g.pci_bus_id, g.numa)});
      }
    }
  }
  std::set<std::string> models;
  for (const auto& g : node.gpus) models.insert(g.model);
  if (models.size() > 1) {
    std::vector<std::string> names(models.begin(), models.end());
    out.push_back({"mixed_gpu_models",
                   fmt::format("GPUs of different models on one node ({}): the slowest sets the pace, and plans "
                               "assume one model per node",
                               join(names, ", "))});
  }
}

}  // namespace detail
}  // namespace dtrain::topology
