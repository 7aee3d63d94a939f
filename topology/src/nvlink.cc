// NVLink: the GPU generations dtrain knows, NVLink from NVML, NVLink inferred from NVSwitch devices, and how the
// links become per-GPU figures and NV# affinities.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "dtrain/common/strings.h"
#include "dtrain/topology/gpu_catalog.h"
#include "topology_internal.h"

namespace dtrain::topology::detail {

namespace {
constexpr NvlinkGeneration kGenerations[] = {
    {"V100", 2, 25.0, 6},
    {"A100", 3, 25.0, 12},
    {"H100", 4, 25.0, 18},
    {"H200", 4, 25.0, 18},
};
}  // namespace

std::optional<NvlinkGeneration> nvlink_generation(const Gpu& gpu) {
  std::string name = lowercase(gpu.catalog_name.empty() ? gpu.model : gpu.catalog_name);
  if (name.empty()) name = lowercase(match_catalog(gpu));
  for (const auto& g : kGenerations) {
    if (name.find(lowercase(g.family)) != std::string::npos) return g;
  }
  return std::nullopt;
}

double nvlink_link_gbps_for_version(int version) {
  if (version == 1) return 20.0;
  if (version >= 2 && version <= 6) return 25.0;
  if (version == 7) return 50.0;
  return 0.0;
}

bool NvlinkGraph::empty() const {
  for (int s : to_switch) {
    if (s > 0) return false;
  }
  for (const auto& row : direct) {
    for (int n : row) {
      if (n > 0) return false;
    }
  }
  return true;
}

NvlinkGraph make_nvlink_graph(int gpus) {
  auto n = static_cast<std::size_t>(std::max(gpus, 0));
  NvlinkGraph g;
  g.direct.assign(n, std::vector<int>(n, 0));
  g.to_switch.assign(n, 0);
  g.link_gbps.assign(n, 0.0);
  g.version.assign(n, 0);
  return g;
}

NvlinkGraph nvlink_from_nvml(const NodeTopology& node, const NvmlReport& nvml) {
  NvlinkGraph graph = make_nvlink_graph(node.gpu_count());
  std::map<std::string, std::size_t> index_of;
  for (std::size_t g = 0; g < node.gpus.size(); ++g) index_of[node.gpus[g].pci_bus_id] = g;
  for (const auto& ng : nvml.gpus) {
    auto it = index_of.find(ng.pci_bus_id);
    if (it == index_of.end()) continue;
    std::size_t g = it->second;
    auto gen = nvlink_generation(node.gpus[g]);
    for (const auto& link : ng.active_links) {
      // The generation is unambiguous; NVML's version number is not (see nvlink_link_gbps_for_version).
      double gbps = gen ? gen->link_gbps : nvlink_link_gbps_for_version(link.version);
      if (gbps <= 0) gbps = 25.0;
      graph.link_gbps[g] = gbps;
      graph.version[g] = gen ? gen->version : link.version;
      auto peer = index_of.find(link.remote_pci_bus_id);
      if (peer != index_of.end() && peer->second != g) {
        graph.direct[g][peer->second] += 1;
      } else {
        // Not one of our GPUs: an NVSwitch (on H100 boards the switches need not be visible on the host's PCI bus).
        graph.to_switch[g] += 1;
      }
    }
  }
  if (!graph.empty()) graph.source = NvlinkSource::kNvml;
  return graph;
}

NvlinkGraph infer_nvlink(const NodeTopology& node) {
  NvlinkGraph graph = make_nvlink_graph(node.gpu_count());
  if (node.nvswitches.empty() || node.gpus.empty()) return graph;
  std::set<std::string_view> families;
  std::optional<NvlinkGeneration> gen;
  for (const auto& gpu : node.gpus) {
    gen = nvlink_generation(gpu);
    families.insert(gen ? gen->family : std::string_view("?"));
  }
  // PCIe cards sit on no NVSwitch board, and a mixed node cannot share one.
  if (families.size() != 1 || !gen) return graph;
  for (const auto& gpu : node.gpus) {
    if (lowercase(gpu.catalog_name).find("pcie") != std::string::npos) return graph;
  }
  for (std::size_t g = 0; g < node.gpus.size(); ++g) {
    graph.to_switch[g] = gen->switch_links;
    graph.link_gbps[g] = gen->link_gbps;
    graph.version[g] = gen->version;
  }
  graph.source = NvlinkSource::kInferred;
  return graph;
}

void apply_nvlink(NodeTopology& node, const NvlinkGraph& graph) {
  std::size_t n = node.gpus.size();
  for (std::size_t g = 0; g < n; ++g) {
    GpuNvlink& nv = node.gpus[g].nvlink;
    int direct = 0;
    for (std::size_t h = 0; h < n; ++h) direct += graph.direct[g][h];
    nv.links = direct + graph.to_switch[g];
    nv.switch_links = graph.to_switch[g];
    nv.link_gbps = nv.links > 0 ? graph.link_gbps[g] : 0;
    nv.gbps = nv.links * nv.link_gbps;
    nv.version = nv.links > 0 ? graph.version[g] : 0;
    nv.source = nv.links > 0 ? graph.source : NvlinkSource::kNone;
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      int links = std::max(graph.direct[i][j], graph.direct[j][i]);
      if (graph.to_switch[i] > 0 && graph.to_switch[j] > 0) {
        links += std::min(graph.to_switch[i], graph.to_switch[j]);
      }
      if (links > 0) node.gpu_gpu[i][j] = Link{Affinity::kNvlink, links};
    }
  }
}

std::string match_catalog(const Gpu& gpu) {
  if (!gpu.model.empty()) {
    if (auto spec = find_gpu(gpu.model)) return spec->name;
  }
  if (gpu.vendor_id != 0) {
    if (auto spec = find_gpu(fmt::format("{:04x}:{:04x}", gpu.vendor_id, gpu.device_id))) return spec->name;
  }
  return "";
}

}  // namespace dtrain::topology::detail
