// A discovered node as the planner's cluster description, with the provenance of every figure.
#include "dtrain/topology/to_cluster.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "dtrain/common/error.h"
#include "dtrain/common/log.h"
#include "dtrain/common/strings.h"
#include "dtrain/topology/binding.h"
#include "dtrain/topology/gpu_catalog.h"

namespace dtrain::topology {
namespace {

Error topology_error(const std::string& message) { return Error(ErrorCategory::kTopology, message); }

std::string where(const NodeTopology& node) {
  return node.source == "xml" ? fmt::format("hwloc XML {}", node.path) : std::string("this machine");
}

bool all_linked(const NodeTopology& node, int first, int size) {
  for (int i = first; i < first + size; ++i) {
    for (int j = first; j < first + size; ++j) {
      if (i != j &&
          node.gpu_gpu[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)].affinity != Affinity::kNvlink) {
        return false;
      }
    }
  }
  return true;
}

// The largest d dividing the GPU count such that each block of d consecutive GPUs is NVLink-connected pair by pair:
// the planner places tensor-parallel groups on consecutive GPUs of one such domain.
int nvlink_domain(const NodeTopology& node) {
  int g = node.gpu_count();
  for (int d = g; d > 1; --d) {
    if (g % d != 0) continue;
    bool ok = true;
    for (int first = 0; ok && first < g; first += d) ok = all_linked(node, first, d);
    if (ok) return d;
  }
  return 1;
}

std::string nvlink_phrase(const Gpu& gpu) {
  const GpuNvlink& nv = gpu.nvlink;
  std::string links = fmt::format("{} NVLink{} links x {:g} GB/s per GPU", nv.links,
                                  nv.version > 0 ? std::to_string(nv.version) : "", nv.link_gbps);
  switch (nv.source) {
    case NvlinkSource::kHwloc:
      return fmt::format("observed: hwloc NVLinkBandwidth matrix, {}", links);
    case NvlinkSource::kNvml:
      return fmt::format("observed: NVML link states, {}", links);
    case NvlinkSource::kInferred:
      return fmt::format("inferred: NVSwitch PCI devices + {} generation, {}", gpu.catalog_name, links);
    case NvlinkSource::kNone:
      break;
  }
  return "";
}

}  // namespace

ClusterSpec cluster_from_topology(const NodeTopology& node, int nodes) {
  if (nodes < 1) throw input_error(fmt::format("--nodes {}: a cluster needs at least one node", nodes));
  if (node.gpus.empty()) {
    throw topology_error(fmt::format(
        "{} has no NVIDIA GPU, so it cannot describe a GPU cluster; for CPU runs use a cluster.toml such as "
        "examples/clusters/local-cpu.toml",
        where(node)));
  }
  std::set<std::string> models;
  for (const auto& g : node.gpus) models.insert(g.model);
  if (models.size() > 1) {
    throw topology_error(fmt::format("{} mixes GPU models ({}); plans assume one GPU model per node", where(node),
                                     join({models.begin(), models.end()}, ", ")));
  }
  const Gpu& gpu0 = node.gpus.front();
  auto spec_gpu = gpu0.catalog_name.empty() ? std::nullopt : find_gpu(gpu0.catalog_name);
  if (!spec_gpu) {
    throw topology_error(fmt::format(
        "{}: GPU model \"{}\" (PCI {:04x}:{:04x}) is not in dtrain's GPU catalog ({}); write cluster.toml by hand "
        "with the GPU described in a [gpu] table (name, memory_gib, hbm_gbps, tflops_*), taking the other [node] "
        "figures from `dtplan topo`",
        where(node), gpu0.model, gpu0.vendor_id, gpu0.device_id, join(catalog_names(), ", ")));
  }

  ClusterSpec spec;
  spec.name = !node.machine.empty() ? node.machine : !node.hostname.empty() ? node.hostname : "discovered-node";
  spec.nodes = nodes;
  spec.source = node.source == "xml" ? node.path : "live";
  auto& prov = spec.provenance;
  const std::string from = node.source == "xml" ? "hwloc XML" : "hwloc";
  NodeSpec& ns = spec.node;

  ns.gpus = node.gpu_count();
  prov["node.gpus"] = fmt::format("observed: {} NVIDIA GPUs in {}", ns.gpus, from);
  ns.gpu = *spec_gpu;
  prov["node.gpu"] =
      fmt::format("observed: \"{}\" ({}) matched to catalog entry {}", gpu0.model, gpu0.model_source, spec_gpu->name);
  if (nodes > 1) prov["cluster.nodes"] = fmt::format("given: {} nodes like this one", nodes);

  ns.nvlink_domain = nvlink_domain(node);
  if (ns.nvlink_domain > 1) {
    double gbps = node.gpus.front().nvlink.gbps;
    const Gpu* slowest = &node.gpus.front();
    for (const auto& g : node.gpus) {
      if (g.nvlink.gbps < gbps) {
        gbps = g.nvlink.gbps;
        slowest = &g;
      }
    }
    ns.nvlink_gbps = gbps;
    std::string phrase = nvlink_phrase(*slowest);
    prov["node.nvlink_domain"] =
        fmt::format("{} ({} GPUs NVLink-connected pair by pair)", phrase.substr(0, phrase.find(',')), ns.nvlink_domain);
    bool uniform = std::all_of(node.gpus.begin(), node.gpus.end(), [&](const Gpu& g) { return g.nvlink.gbps == gbps; });
    prov["node.nvlink_gbps"] = phrase + (uniform ? "" : fmt::format(" (GPU{}, the slowest)", slowest->index));
  } else {
    prov["node.nvlink_domain"] = fmt::format("observed: no NVLink between the GPUs in {}; PCIe only", from);
  }

  double pcie = 0;
  for (const auto& g : node.gpus) {
    if (g.pcie_gbps > 0) pcie = pcie == 0 ? g.pcie_gbps : std::min(pcie, g.pcie_gbps);
  }
  if (pcie > 0) {
    ns.pcie_gbps = pcie;
    prov["node.pcie_gbps"] = fmt::format("observed: {} PCI link speed of the GPUs ({:.1f} GB/s)", from, pcie);
  } else {
    prov["node.pcie_gbps"] = fmt::format("defaulted: {:g} GB/s (no PCI link speed in the topology)", ns.pcie_gbps);
  }
  if (ns.nvlink_domain == 1) {
    ns.nvlink_gbps = ns.pcie_gbps;
    prov["node.nvlink_gbps"] = "the PCIe figure (no NVLink domain)";
  }

  // NICs: the usable ones; a NIC with its port down carries nothing.
  std::vector<int> usable;
  for (std::size_t k = 0; k < node.nics.size(); ++k) {
    if (node.nics[k].usable()) usable.push_back(static_cast<int>(k));
  }
  if (!usable.empty()) {
    ns.nics = static_cast<int>(usable.size());
    std::vector<std::string> names;
    names.reserve(usable.size());
    for (int k : usable) names.push_back(node.nics[static_cast<std::size_t>(k)].name);
    prov["node.nics"] = fmt::format("observed: {} usable RDMA NIC(s) in {} ({})", ns.nics, from, join(names, ", "));
    const Nic* slowest = nullptr;
    for (int k : usable) {
      const Nic& n = node.nics[static_cast<std::size_t>(k)];
      if (n.gbps > 0 && (slowest == nullptr || n.gbps < slowest->gbps)) slowest = &n;
    }
    if (slowest != nullptr) {
      ns.nic_gbps = slowest->gbps;
      bool sysfs = slowest->gbps_source == "sysfs";
      prov["node.nic_gbps"] =
          sysfs ? fmt::format("observed: sysfs link rate of {} ({:g} GB/s)", slowest->name, slowest->gbps)
                : slowest->gbps_source;
    } else {
      prov["node.nic_gbps"] = fmt::format(
          "defaulted: {:g} GB/s (200 Gb/s HDR); the topology has no link rate for these NICs — measure with "
          "ib_write_bw and set [node] nic_gbps",
          ns.nic_gbps);
    }
    // Rails: the NIC binding gives GPU g, counted among the usable NICs.
    std::vector<Binding> bindings = bind_node(node, ns.gpus);
    for (const auto& b : bindings) {
      int rail = 0;
      if (!b.nics.empty()) {
        rail = static_cast<int>(std::find(usable.begin(), usable.end(), b.nics.front()) - usable.begin());
      }
      ns.nic_of_gpu.push_back(rail);
    }
    prov["node.nic_of_gpu"] = "observed: nearest usable NIC of each GPU (PCIe affinity)";
  } else if (nodes > 1) {
    ns.nics = ns.gpus;
    prov["node.nics"] = fmt::format(
        "defaulted: {} (one per GPU); {} shows no usable InfiniBand/RoCE/EFA NIC — describe the real network in "
        "cluster.toml",
        ns.nics, where(node));
    prov["node.nic_gbps"] = fmt::format("defaulted: {:g} GB/s (200 Gb/s HDR)", ns.nic_gbps);
    log::warn("topology", "{} has no usable RDMA NIC; assuming {} NICs of {:g} GB/s for {} nodes", where(node), ns.nics,
              ns.nic_gbps, nodes);
  } else {
    ns.nics = 0;
    prov["node.nics"] = fmt::format("observed: no usable RDMA NIC in {} (one node needs none)", from);
    prov["node.nic_gbps"] = fmt::format("defaulted: {:g} GB/s (unused: no NIC on a one-node cluster)", ns.nic_gbps);
  }

  spec = default_network(std::move(spec));
  prov["network"] = "defaulted: built-in latencies and collective efficiency curves (docs/cost-model.md)";
  validate(spec);
  return spec;
}

ClusterSpec load_cluster_from_topology(const std::string& xml_path, int nodes) {
  return cluster_from_topology(load_node_topology(xml_path), nodes);
}

std::string node_toml_with_provenance(const ClusterSpec& spec) {
  std::string out = fmt::format("# [node] of cluster.toml for \"{}\", from {}\n", spec.name,
                                spec.source == "live" ? "this machine" : spec.source);
  // node_toml() writes one key per line; put each key's provenance above it.
  for (const std::string& line : split(node_toml(spec), '\n')) {
    if (line.empty()) continue;
    std::string key(trim(line.substr(0, line.find('='))));
    if (auto it = spec.provenance.find("node." + key); it != spec.provenance.end()) {
      out += "# " + it->second + "\n";
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace dtrain::topology
