// dtplan topo's reports: summary, nvidia-smi-style matrix, JSON.
#include "dtrain/topology/topology_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "dtrain/common/strings.h"
#include "dtrain/topology/binding.h"

namespace dtrain::topology {
namespace {

std::string hex4(unsigned v) { return fmt::format("{:04x}", v); }

std::string source_line(const NodeTopology& node) {
  std::string name = !node.machine.empty() ? node.machine : !node.hostname.empty() ? node.hostname : "node";
  if (node.source == "xml") {
    return fmt::format("Node: {}, from hwloc XML {}{}", name, node.path,
                       node.hwloc_version.empty() ? "" : fmt::format(" (written by hwloc {})", node.hwloc_version));
  }
  return fmt::format("Node: {}, this machine (hwloc {})", name, node.hwloc_version);
}

std::string gbps_text(double gbps) { return fmt::format("{:g} GB/s", gbps); }

std::string nvlink_text(const GpuNvlink& nv) {
  if (nv.source == NvlinkSource::kNone) return "NVLink none";
  return fmt::format("NVLink {} x {} = {} ({})", nv.links, gbps_text(nv.link_gbps), gbps_text(nv.gbps),
                     to_string(nv.source));
}

// The NICs closest to a GPU (its best class among usable NICs), as "mlx5_0, mlx5_1 (PIX)".
std::string nearest_nics(const NodeTopology& node, std::size_t g) {
  Affinity best = Affinity::kSys;
  bool any = false;
  for (std::size_t k = 0; k < node.nics.size(); ++k) {
    if (!node.nics[k].usable()) continue;
    best = std::min(best, node.gpu_nic[g][k]);
    any = true;
  }
  if (!any) return "none";
  std::vector<std::string> names;
  for (std::size_t k = 0; k < node.nics.size(); ++k) {
    if (node.nics[k].usable() && node.gpu_nic[g][k] == best) names.push_back(node.nics[k].name);
  }
  return fmt::format("{} ({})", join(names, ", "), to_string(best));
}

// Rows of cells as aligned columns, indented by two spaces, two spaces between columns.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = " ";
    for (std::size_t c = 0; c < row.size(); ++c) line += fmt::format(" {:<{}} ", row[c], width[c]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string format_summary(const NodeTopology& node) {
  std::string out = source_line(node) + "\n";
  out += fmt::format("CPU: {} package(s), {} NUMA node(s), {} core(s), {} PU(s)\n", node.packages, node.numa_count(),
                     node.core_count(), node.pus);
  for (const auto& n : node.numa_nodes) {
    int cores = static_cast<int>(
        std::count_if(node.cores.begin(), node.cores.end(), [&](const Core& c) { return c.numa == n.os_index; }));
    out += fmt::format("  NUMA {}: {} core(s), PUs {}, {}\n", n.os_index, cores, format_cpu_list(n.cpus),
                       format_bytes(static_cast<double>(n.memory_bytes)));
  }
  std::set<std::string> models;
  for (const auto& g : node.gpus) models.insert(g.model);
  if (node.gpus.empty()) {
    out += "GPUs: none\n";
  } else {
    const Gpu& g0 = node.gpus.front();
    out += fmt::format("GPUs: {}", node.gpu_count());
    if (models.size() == 1) {
      out += fmt::format(" x {} ({})", g0.model,
                         g0.catalog_name.empty() ? "not in the GPU catalog" : "catalog " + g0.catalog_name);
    }
    out += "\n";
    std::vector<std::vector<std::string>> rows;
    for (std::size_t i = 0; i < node.gpus.size(); ++i) {
      const Gpu& g = node.gpus[i];
      std::string mem = g.memory_bytes > 0
                            ? fmt::format("{} ({})", format_bytes(static_cast<double>(g.memory_bytes)), g.memory_source)
                            : "memory unknown";
      rows.push_back({fmt::format("GPU{}", g.index), g.pci_bus_id,
                      "NUMA " + (g.numa >= 0 ? std::to_string(g.numa) : std::string("?")), mem, nvlink_text(g.nvlink),
                      "NIC " + nearest_nics(node, i), models.size() > 1 ? g.model : ""});
    }
    out += table(rows);
  }
  if (!node.nvswitches.empty()) {
    std::set<std::string> ids;
    for (const auto& s : node.nvswitches) {
      if (s.device_id != 0) ids.insert("10de:" + hex4(s.device_id));
    }
    out += fmt::format("NVSwitches: {} ({})\n", node.nvswitches.size(), join({ids.begin(), ids.end()}, ", "));
  }
  if (node.nics.empty()) {
    out += "NICs: none (no InfiniBand, RoCE or EFA device)\n";
  } else {
    out += fmt::format("NICs: {}\n", node.nics.size());
    std::vector<std::vector<std::string>> rows;
    for (std::size_t k = 0; k < node.nics.size(); ++k) {
      const Nic& n = node.nics[k];
      rows.push_back({fmt::format("NIC{}", k), n.name, std::string(to_string(n.kind)), n.state_name(),
                      "NUMA " + (n.numa >= 0 ? std::to_string(n.numa) : std::string("?")),
                      n.pci_bus_id.empty() ? "no PCI address" : n.pci_bus_id,
                      n.gbps > 0 ? fmt::format("{} ({})", gbps_text(n.gbps), n.gbps_source) : "rate unknown",
                      n.netdevs.empty() ? "" : "netdevs " + join(n.netdevs, ", ")});
    }
    out += table(rows);
  }
  if (node.source == "live") out += fmt::format("NVML: {}\n", node.nvml_status);
  if (node.anomalies.empty()) {
    out += "Anomalies: none\n";
  } else {
    out += fmt::format("Anomalies: {}\n", node.anomalies.size());
    for (const auto& a : node.anomalies) out += fmt::format("  [{}] {}\n", a.kind, a.message);
  }
  if (!node.notes.empty()) {
    out += "Notes:\n";
    for (const auto& n : node.notes) out += "  " + n + "\n";
  }
  return out;
}

std::string format_matrix(const NodeTopology& node) {
  std::size_t g = node.gpus.size(), n = node.nics.size();
  if (g == 0 && n == 0) {
    return fmt::format("No GPU and no RDMA NIC on this node: no affinity matrix ({} NUMA node(s), {} core(s)).\n",
                       node.numa_count(), node.core_count());
  }
  std::vector<std::string> names;
  for (std::size_t i = 0; i < g; ++i) names.push_back(fmt::format("GPU{}", i));
  for (std::size_t k = 0; k < n; ++k) names.push_back(fmt::format("NIC{}", k));
  // cell(r, c) for the square part of the matrix.
  auto cell = [&](std::size_t r, std::size_t c) -> std::string {
    if (r < g && c < g) return label(node.gpu_gpu[r][c]);
    if (r < g) return std::string(to_string(node.gpu_nic[r][c - g]));
    if (c < g) return std::string(to_string(node.gpu_nic[c][r - g]));
    return std::string(to_string(node.nic_nic[r - g][c - g]));
  };
  std::size_t width = 6;
  for (const auto& name : names) width = std::max(width, name.size() + 2);
  for (std::size_t r = 0; r < g + n; ++r) {
    for (std::size_t c = 0; c < g + n; ++c) width = std::max(width, cell(r, c).size() + 2);
  }
  std::vector<std::string> cpu_col, numa_col;
  std::size_t cpu_width = std::string("CPU Affinity").size() + 2;
  for (std::size_t i = 0; i < g; ++i) {
    cpu_col.push_back(format_cpu_list(node.gpus[i].local_cpus));
    numa_col.push_back(node.gpus[i].numa >= 0 ? std::to_string(node.gpus[i].numa) : "N/A");
    cpu_width = std::max(cpu_width, cpu_col.back().size() + 2);
  }
  std::string out = fmt::format("{:<8}", "");
  for (const auto& name : names) out += fmt::format("{:<{}}", name, width);
  if (g > 0) out += fmt::format("{:<{}}{}", "CPU Affinity", cpu_width, "NUMA Affinity");
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += "\n";
  for (std::size_t r = 0; r < g + n; ++r) {
    std::string line = fmt::format("{:<8}", names[r]);
    for (std::size_t c = 0; c < g + n; ++c) line += fmt::format("{:<{}}", cell(r, c), width);
    if (r < g) line += fmt::format("{:<{}}{}", cpu_col[r], cpu_width, numa_col[r]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  out += "\nLegend:\n\n";
  for (Affinity a : {Affinity::kSelf, Affinity::kSys, Affinity::kNode, Affinity::kPhb, Affinity::kPxb, Affinity::kPix,
                     Affinity::kNvlink}) {
    std::string key = a == Affinity::kNvlink ? "NV#" : std::string(to_string(a));
    out += fmt::format("  {:<4} = {}\n", key, describe(a));
  }
  if (n > 0) {
    out += "\nNIC Legend:\n\n";
    for (std::size_t k = 0; k < n; ++k) out += fmt::format("  NIC{}: {}\n", k, node.nics[k].name);
  }
  return out;
}

std::string topology_json(const NodeTopology& node) {
  using json = nlohmann::ordered_json;
  json j;
  j["format"] = 1;
  j["source"] = node.source;
  j["path"] = node.source == "xml" ? json(node.path) : json(nullptr);
  j["machine"] = node.machine;
  j["hostname"] = node.hostname;
  j["hwloc_version"] = node.hwloc_version;
  j["packages"] = node.packages;
  j["numa_nodes"] = node.numa_count();
  j["cores"] = node.core_count();
  j["pus"] = node.pus;
  json numa = json::array();
  for (const auto& n : node.numa_nodes) {
    numa.push_back({{"os_index", n.os_index}, {"cpus", format_cpu_list(n.cpus)}, {"memory_bytes", n.memory_bytes}});
  }
  j["numa"] = numa;
  json gpus = json::array();
  for (const auto& g : node.gpus) {
    json nv = {{"links", g.nvlink.links},         {"switch_links", g.nvlink.switch_links},
               {"link_gbps", g.nvlink.link_gbps}, {"gbps", g.nvlink.gbps},
               {"version", g.nvlink.version},     {"source", to_string(g.nvlink.source)}};
    gpus.push_back({{"index", g.index},
                    {"pci_bus_id", g.pci_bus_id},
                    {"pci_id", hex4(g.vendor_id) + ":" + hex4(g.device_id)},
                    {"model", g.model},
                    {"model_source", g.model_source},
                    {"catalog", g.catalog_name.empty() ? json(nullptr) : json(g.catalog_name)},
                    {"memory_bytes", g.memory_bytes > 0 ? json(g.memory_bytes) : json(nullptr)},
                    {"memory_source", g.memory_source},
                    {"numa", g.numa >= 0 ? json(g.numa) : json(nullptr)},
                    {"cpus", format_cpu_list(g.local_cpus)},
                    {"pcie_gbps", g.pcie_gbps},
                    {"os_devices", g.os_devices},
                    {"nvlink", nv}});
  }
  j["gpus"] = gpus;
  json switches = json::array();
  for (const auto& s : node.nvswitches) {
    switches.push_back({{"pci_bus_id", s.pci_bus_id},
                        {"pci_id", "10de:" + hex4(s.device_id)},
                        {"numa", s.numa >= 0 ? json(s.numa) : json(nullptr)}});
  }
  j["nvswitches"] = switches;
  json nics = json::array();
  for (std::size_t k = 0; k < node.nics.size(); ++k) {
    const Nic& n = node.nics[k];
    json ports = json::array();
    for (const auto& p : n.ports) {
      ports.push_back({{"number", p.number}, {"state", p.state}, {"gbps", p.gbps}, {"rate", p.rate_text}});
    }
    nics.push_back({{"index", k},
                    {"name", n.name},
                    {"kind", to_string(n.kind)},
                    {"state", n.state_name()},
                    {"port", n.port()},
                    {"ports", ports},
                    {"gbps", n.gbps > 0 ? json(n.gbps) : json(nullptr)},
                    {"gbps_source", n.gbps_source},
                    {"numa", n.numa >= 0 ? json(n.numa) : json(nullptr)},
                    {"pci_bus_id", n.pci_bus_id.empty() ? json(nullptr) : json(n.pci_bus_id)},
                    {"pci_id", n.vendor_id != 0 ? json(hex4(n.vendor_id) + ":" + hex4(n.device_id)) : json(nullptr)},
                    {"netdevs", n.netdevs}});
  }
  j["nics"] = nics;
  json gg = json::array(), gn = json::array(), nn = json::array();
  for (const auto& row : node.gpu_gpu) {
    json r = json::array();
    for (const auto& l : row) r.push_back(label(l));
    gg.push_back(r);
  }
  for (const auto& row : node.gpu_nic) {
    json r = json::array();
    for (Affinity a : row) r.push_back(to_string(a));
    gn.push_back(r);
  }
  for (const auto& row : node.nic_nic) {
    json r = json::array();
    for (Affinity a : row) r.push_back(to_string(a));
    nn.push_back(r);
  }
  j["affinity"] = {{"gpu_gpu", gg}, {"gpu_nic", gn}, {"nic_nic", nn}};
  if (node.source == "live") j["nvml"] = {{"available", node.nvml_available}, {"status", node.nvml_status}};
  json anomalies = json::array();
  for (const auto& a : node.anomalies) anomalies.push_back({{"kind", a.kind}, {"message", a.message}});
  j["anomalies"] = anomalies;
  j["notes"] = node.notes;
  return j.dump(2) + "\n";
}

}  // namespace dtrain::topology
