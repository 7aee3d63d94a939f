// Node discovery through hwloc: the live machine or an XML file, read into a NodeTopology.
#include <fmt/format.h>
#include <hwloc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/common/strings.h"
#include "dtrain/topology/gpu_catalog.h"
#include "dtrain/topology/node_topology.h"
#include "dtrain/topology/nvml.h"
#include "topology_internal.h"

namespace dtrain::topology {
namespace {

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kClassDisplayBase = 0x03;    // 0x0300 VGA, 0x0302 3D controller
constexpr unsigned kClassBridgeOther = 0x0680;  // NVSwitch (and POWER NPUs, from other vendors)

// Owns an hwloc topology handle.
class Topology {
 public:
  Topology() {
    if (hwloc_topology_init(&t_) != 0) throw Error(ErrorCategory::kTopology, "hwloc_topology_init failed");
  }
  ~Topology() { hwloc_topology_destroy(t_); }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
  hwloc_topology_t get() const { return t_; }

 private:
  hwloc_topology_t t_ = nullptr;
};

// The release dtrain was built against ("2.9.0"); hwloc_get_api_version() gives the API level (2.8.0 for 2.9).
std::string hwloc_library_version() {
#ifdef HWLOC_VERSION
  return HWLOC_VERSION;
#else
  unsigned v = hwloc_get_api_version();
  return fmt::format("{}.{}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff);
#endif
}

const char* info_of(hwloc_obj_t obj, const char* name) {
  const char* v = hwloc_obj_get_info_by_name(obj, name);
  return v != nullptr ? v : "";
}

std::vector<int> cpu_list(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr) return out;
  for (int id = hwloc_bitmap_first(set); id >= 0; id = hwloc_bitmap_next(set, id)) out.push_back(id);
  return out;
}

int single_numa(hwloc_const_bitmap_t nodeset) {
  if (nodeset == nullptr || hwloc_bitmap_weight(nodeset) != 1) return -1;
  return hwloc_bitmap_first(nodeset);
}

bool is_io(hwloc_obj_t obj) {
  return obj->type == HWLOC_OBJ_BRIDGE || obj->type == HWLOC_OBJ_PCI_DEVICE || obj->type == HWLOC_OBJ_OS_DEVICE;
}

bool is_host_bridge(hwloc_obj_t obj) {
  return obj->type == HWLOC_OBJ_BRIDGE && obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
}

std::string bus_id_of(hwloc_obj_t pci) {
  const auto& p = pci->attr->pcidev;
  return format_pci_bus_id(p.domain, p.bus, p.dev, p.func);
}

// The nearest PCI device at or above `obj` (an OS device hangs below its PCI function), or nullptr.
hwloc_obj_t pci_of(hwloc_obj_t obj) {
  for (hwloc_obj_t o = obj; o != nullptr && is_io(o); o = o->parent) {
    if (o->type == HWLOC_OBJ_PCI_DEVICE) return o;
  }
  return nullptr;
}

// Where a device sits on the CPU side: NUMA node and local PUs of its first non-I/O ancestor.
struct Locality {
  int numa = -1;
  std::vector<int> cpus;
};
Locality locality_of(hwloc_topology_t t, hwloc_obj_t obj) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, obj);
  Locality l;
  if (anc != nullptr) {
    l.numa = single_numa(anc->nodeset);
    l.cpus = cpu_list(anc->cpuset);
  }
  return l;
}

// The PCIe class of the path between two devices (see affinity.h).
Affinity pci_affinity(hwloc_obj_t a, hwloc_obj_t b, int numa_a, int numa_b) {
  if (a == b) return Affinity::kPix;
  std::set<hwloc_obj_t> above_a;
  for (hwloc_obj_t o = a->parent; o != nullptr; o = o->parent) above_a.insert(o);
  hwloc_obj_t lca = nullptr;
  for (hwloc_obj_t o = b->parent; o != nullptr; o = o->parent) {
    if (above_a.count(o) != 0) {
      lca = o;
      break;
    }
  }
  if (lca == nullptr || !is_io(lca)) {
    // They meet on the CPU side: different host bridges.
    return (numa_a >= 0 && numa_a == numa_b) ? Affinity::kNode : Affinity::kSys;
  }
  auto bridges_below = [lca](hwloc_obj_t from) {
    int n = 0;
    for (hwloc_obj_t o = from->parent; o != nullptr && o != lca; o = o->parent) {
      if (o->type == HWLOC_OBJ_BRIDGE) ++n;
    }
    return n;
  };
  int below = std::max(bridges_below(a), bridges_below(b));
  if (is_host_bridge(lca)) {
    // Devices directly on one root bus. Virtual machines (AWS p4d/p5) give each physical PCIe switch its own root bus
    // and hide the switch itself, which is how AWS's NCCL topology files for p4d describe it: the GPUs and the EFA
    // NIC on one such bus share a switch. On bare metal a root bus carries only integrated devices.
    if (a->parent == lca && b->parent == lca) return Affinity::kPix;
    return Affinity::kPhb;
  }
  // Below a PCI-to-PCI bridge: one switch is its upstream port (the meeting point) plus one downstream port on each
  // side; anything deeper crosses another switch.
  return below <= 1 ? Affinity::kPix : Affinity::kPxb;
}

// NVIDIA's bridge class marks an NVSwitch; hwloc's NVML backend also tags the switches it finds as links' far ends
// with subtype "NVSwitch" (the DGX-2 XML has one whose PCI ids were not read).
bool is_nvswitch(hwloc_obj_t pci) {
  if (pci == nullptr || pci->type != HWLOC_OBJ_PCI_DEVICE) return false;
  if (pci->subtype != nullptr && std::strcmp(pci->subtype, "NVSwitch") == 0) return true;
  return pci->attr->pcidev.vendor_id == kNvidiaVendor && pci->attr->pcidev.class_id == kClassBridgeOther;
}

struct GpuCandidate {
  hwloc_obj_t pci = nullptr;
  std::string bus_id;
  std::vector<hwloc_obj_t> osdevs;  // GPU/co-processor OS devices below it
};

// The backend of a GPU OS device: "cuda", "nvml", "opencl", or "" (DRM card/render nodes and unknown ones).
std::string gpu_backend(hwloc_obj_t osdev) {
  std::string backend = lowercase(info_of(osdev, "Backend"));
  if (!backend.empty()) return backend;
  std::string subtype = osdev->subtype != nullptr ? lowercase(osdev->subtype) : "";
  if (!subtype.empty()) return subtype;
  std::string name = osdev->name != nullptr ? osdev->name : "";
  if (starts_with(name, "cuda")) return "cuda";
  if (starts_with(name, "nvml")) return "nvml";
  if (starts_with(name, "opencl")) return "opencl";
  return "";
}

// Model and memory of a GPU from one of its OS devices; returns true when it gave a model.
bool take_gpu_info(hwloc_obj_t osdev, Gpu& gpu) {
  std::string backend = gpu_backend(osdev);
  std::string model = info_of(osdev, "GPUModel");
  if (model.empty() || (backend != "cuda" && backend != "nvml" && backend != "opencl")) return false;
  gpu.model = model;
  gpu.model_source = backend;
  // Both report KiB.
  const char* mem_key = backend == "cuda" ? "CUDAGlobalMemorySize" : "OpenCLGlobalMemorySize";
  if (auto kib = parse_int(info_of(osdev, mem_key)); kib && *kib > 0) {
    gpu.memory_bytes = static_cast<std::uint64_t>(*kib) * 1024;
    gpu.memory_source = backend;
  }
  return true;
}

// Ranks how trustworthy a model source is, to let CUDA/NVML win over OpenCL on the same GPU.
int source_rank(const std::string& s) { return s == "nvml" ? 3 : s == "cuda" ? 2 : s == "opencl" ? 1 : 0; }

void read_cpu_side(hwloc_topology_t t, NodeTopology& node) {
  node.packages = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE));
  node.pus = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU));
  int numa = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < numa; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode nn;
    nn.os_index = static_cast<int>(n->os_index);
    nn.cpus = cpu_list(n->cpuset);
    nn.memory_bytes = n->attr->numanode.local_memory;
    node.numa_nodes.push_back(std::move(nn));
  }
  // Some virtual machines expose PUs without cores; a PU then stands for its own core.
  hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  int cores = hwloc_get_nbobjs_by_type(t, core_type);
  for (int i = 0; i < cores; ++i) {
    hwloc_obj_t c = hwloc_get_obj_by_type(t, core_type, static_cast<unsigned>(i));
    Core core;
    core.index = i;
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, c);
    core.package = pkg != nullptr ? static_cast<int>(pkg->logical_index) : 0;
    core.numa = single_numa(c->nodeset);
    core.pus = cpu_list(c->cpuset);
    node.cores.push_back(std::move(core));
  }
}

// /proc/driver/nvidia/gpus/<bus id> exists for every GPU the NVIDIA kernel driver has claimed.
bool nvidia_driver_claims(const std::string& bus_id) {
  std::error_code ec;
  return std::filesystem::exists("/proc/driver/nvidia/gpus/" + bus_id, ec);
}

struct Reader {
  hwloc_topology_t t;
  bool live;
  const NvmlReport* nvml;
  NodeTopology node;
  std::vector<hwloc_obj_t> gpu_objs;  // PCI object of each GPU
  std::vector<hwloc_obj_t> nic_objs;  // PCI object (or the OS device when it has none) of each NIC

  void read_gpus();
  void assign_orphan_gpu_osdevs();
  void read_nvswitches();
  void read_nics();
  void compute_pci_affinity();
  void read_nvlink();
};

void Reader::read_gpus() {
  std::vector<GpuCandidate> candidates;
  for (hwloc_obj_t p = hwloc_get_next_pcidev(t, nullptr); p != nullptr; p = hwloc_get_next_pcidev(t, p)) {
    const auto& a = p->attr->pcidev;
    if (a.vendor_id != kNvidiaVendor || (a.class_id >> 8) != kClassDisplayBase) continue;
    GpuCandidate c;
    c.pci = p;
    c.bus_id = bus_id_of(p);
    for (hwloc_obj_t o = p->io_first_child; o != nullptr; o = o->next_sibling) {
      if (o->type == HWLOC_OBJ_OS_DEVICE &&
          (o->attr->osdev.type == HWLOC_OBJ_OSDEV_GPU || o->attr->osdev.type == HWLOC_OBJ_OSDEV_COPROC)) {
        c.osdevs.push_back(o);
      }
    }
    candidates.push_back(std::move(c));
  }
  std::set<std::string> nvml_buses;
  if (nvml != nullptr && nvml->available) {
    for (const auto& g : nvml->gpus) nvml_buses.insert(g.pci_bus_id);
  }
  std::vector<std::string> left_out;
  for (auto& c : candidates) {
    const auto& a = c.pci->attr->pcidev;
    Gpu gpu;
    gpu.pci_bus_id = c.bus_id;
    gpu.vendor_id = a.vendor_id;
    gpu.device_id = a.device_id;
    // A GPU is a device the driver exposes (an OS device below it, NVML, the kernel driver), or one whose PCI id is
    // a known data-centre GPU. Old boards without a driver (Fermi Teslas in the hwloc test machines) are left out.
    bool known_id = !detail::match_catalog(gpu).empty();
    bool evidence = !c.osdevs.empty() || nvml_buses.count(c.bus_id) != 0 || (live && nvidia_driver_claims(c.bus_id));
    if (!evidence && !known_id) {
      left_out.push_back(fmt::format("{} ({:04x}:{:04x})", c.bus_id, a.vendor_id, a.device_id));
      continue;
    }
    for (hwloc_obj_t o : c.osdevs) {
      if (o->name != nullptr) gpu.os_devices.push_back(o->name);
      Gpu probe;
      if (take_gpu_info(o, probe) && source_rank(probe.model_source) > source_rank(gpu.model_source)) {
        gpu.model = probe.model;
        gpu.model_source = probe.model_source;
        if (probe.memory_bytes > 0) {
          gpu.memory_bytes = probe.memory_bytes;
          gpu.memory_source = probe.memory_source;
        }
      }
    }
    Locality loc = locality_of(t, c.pci);
    gpu.numa = loc.numa;
    gpu.local_cpus = std::move(loc.cpus);
    // hwloc's float (31.507692 for PCIe 4.0 x16) carries no more than two meaningful decimals.
    gpu.pcie_gbps = std::round(static_cast<double>(a.linkspeed) * 100) / 100;
    node.gpus.push_back(std::move(gpu));
    gpu_objs.push_back(c.pci);
  }
  if (!left_out.empty()) {
    node.notes.push_back(fmt::format(
        "{} NVIDIA display device(s) without a driver-visible GPU (no CUDA/NVML/OpenCL/DRM device, unknown PCI id) "
        "left out: {}",
        left_out.size(), join(left_out, ", ")));
  }
  // PCI bus order is nvidia-smi's order and CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID; hwloc walks the tree, which
  // can differ when host bridges are not in bus order.
  std::vector<std::size_t> order(node.gpus.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t x, std::size_t y) { return node.gpus[x].pci_bus_id < node.gpus[y].pci_bus_id; });
  std::vector<Gpu> gpus;
  std::vector<hwloc_obj_t> objs;
  for (std::size_t i : order) {
    gpus.push_back(std::move(node.gpus[i]));
    objs.push_back(gpu_objs[i]);
  }
  node.gpus = std::move(gpus);
  gpu_objs = std::move(objs);
  for (std::size_t i = 0; i < node.gpus.size(); ++i) node.gpus[i].index = static_cast<int>(i);
}

// OpenCL devices without a PCI bus id land on the nearest bridge instead of their GPU (lstopo 2.10 on p4d.24xlarge
// puts two under each host bridge, next to the two GPUs). When a bridge holds as many NVIDIA OpenCL/CUDA devices as
// it has GPUs still without a model, all of them the same model, give them to those GPUs.
void Reader::assign_orphan_gpu_osdevs() {
  std::map<hwloc_obj_t, std::vector<hwloc_obj_t>> orphans;
  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o != nullptr; o = hwloc_get_next_osdev(t, o)) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_GPU && o->attr->osdev.type != HWLOC_OBJ_OSDEV_COPROC) continue;
    if (o->parent == nullptr || o->parent->type == HWLOC_OBJ_PCI_DEVICE) continue;
    if (lowercase(info_of(o, "GPUVendor")).find("nvidia") == std::string::npos) continue;
    if (std::string b = gpu_backend(o); b != "opencl" && b != "cuda") continue;
    orphans[o->parent].push_back(o);
  }
  for (auto& [parent, devs] : orphans) {
    std::vector<std::size_t> takers;
    for (std::size_t g = 0; g < node.gpus.size(); ++g) {
      if (!node.gpus[g].model.empty()) continue;
      for (hwloc_obj_t o = gpu_objs[g]->parent; o != nullptr; o = o->parent) {
        if (o == parent) {
          takers.push_back(g);
          break;
        }
      }
    }
    std::set<std::string> models;
    for (hwloc_obj_t o : devs) models.insert(info_of(o, "GPUModel"));
    if (takers.size() != devs.size() || models.size() != 1) continue;
    for (std::size_t i = 0; i < takers.size(); ++i) {
      Gpu& gpu = node.gpus[takers[i]];
      take_gpu_info(devs[i], gpu);
      if (devs[i]->name != nullptr) gpu.os_devices.push_back(devs[i]->name);
    }
  }
}

void Reader::read_nvswitches() {
  for (hwloc_obj_t p = hwloc_get_next_pcidev(t, nullptr); p != nullptr; p = hwloc_get_next_pcidev(t, p)) {
    if (!is_nvswitch(p)) continue;
    NvSwitch s;
    s.pci_bus_id = bus_id_of(p);
    s.device_id = p->attr->pcidev.device_id;
    s.numa = locality_of(t, p).numa;
    node.nvswitches.push_back(std::move(s));
  }
  std::sort(node.nvswitches.begin(), node.nvswitches.end(),
            [](const NvSwitch& x, const NvSwitch& y) { return x.pci_bus_id < y.pci_bus_id; });
}

void Reader::read_nics() {
  struct Found {
    Nic nic;
    hwloc_obj_t obj;
  };
  std::vector<Found> found;
  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o != nullptr; o = hwloc_get_next_osdev(t, o)) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || o->name == nullptr) continue;
    Nic nic;
    nic.name = o->name;
    hwloc_obj_t pci = pci_of(o);
    unsigned pci_class = 0;
    if (pci != nullptr) {
      nic.pci_bus_id = bus_id_of(pci);
      nic.vendor_id = pci->attr->pcidev.vendor_id;
      nic.device_id = pci->attr->pcidev.device_id;
      pci_class = pci->attr->pcidev.class_id;
      for (hwloc_obj_t s = pci->io_first_child; s != nullptr; s = s->next_sibling) {
        if (s->type == HWLOC_OBJ_OS_DEVICE && s->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && s->name != nullptr) {
          nic.netdevs.push_back(s->name);
        }
      }
    }
    // hwloc records PortNState, PortNLID, ... for each port it saw.
    for (int port = 1; port <= 16; ++port) {
      std::string key = fmt::format("Port{}State", port);
      const char* v = hwloc_obj_get_info_by_name(o, key.c_str());
      if (v == nullptr) continue;
      NicPort p;
      p.number = port;
      p.state = static_cast<int>(parse_int(v).value_or(0));
      nic.ports.push_back(p);
    }
    std::string link_layer;
    if (live) {
      detail::read_sysfs_nic("/sys/class/infiniband", nic, link_layer);
    }
    nic.kind = detail::nic_kind(nic.name, nic.vendor_id, pci_class, nic.netdevs, link_layer);
    if (nic.gbps <= 0) {
      if (auto r = detail::nominal_nic_rate(nic.vendor_id, nic.device_id)) {
        nic.gbps = r->gbps;
        nic.gbps_source = "inferred: " + r->why;
      }
    }
    Locality loc = locality_of(t, o);
    nic.numa = loc.numa;
    nic.local_cpus = std::move(loc.cpus);
    found.push_back({std::move(nic), pci != nullptr ? pci : o});
  }
  std::sort(found.begin(), found.end(), [](const Found& x, const Found& y) {
    return std::tie(x.nic.pci_bus_id, x.nic.name) < std::tie(y.nic.pci_bus_id, y.nic.name);
  });
  for (auto& f : found) {
    node.nics.push_back(std::move(f.nic));
    nic_objs.push_back(f.obj);
  }
}

void Reader::compute_pci_affinity() {
  std::size_t g = node.gpus.size(), n = node.nics.size();
  node.gpu_gpu.assign(g, std::vector<Link>(g));
  node.gpu_nic.assign(g, std::vector<Affinity>(n, Affinity::kSys));
  node.nic_nic.assign(n, std::vector<Affinity>(n, Affinity::kSys));
  for (std::size_t i = 0; i < g; ++i) {
    for (std::size_t j = 0; j < g; ++j) {
      node.gpu_gpu[i][j].affinity =
          i == j ? Affinity::kSelf : pci_affinity(gpu_objs[i], gpu_objs[j], node.gpus[i].numa, node.gpus[j].numa);
    }
    for (std::size_t k = 0; k < n; ++k) {
      node.gpu_nic[i][k] = pci_affinity(gpu_objs[i], nic_objs[k], node.gpus[i].numa, node.nics[k].numa);
    }
  }
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b) {
      node.nic_nic[a][b] =
          a == b ? Affinity::kSelf : pci_affinity(nic_objs[a], nic_objs[b], node.nics[a].numa, node.nics[b].numa);
    }
  }
}

void Reader::read_nvlink() {
  detail::NvlinkGraph graph = detail::make_nvlink_graph(node.gpu_count());
  unsigned nr = 1;
  hwloc_distances_s* dist = nullptr;
  if (hwloc_distances_get_by_name(t, "NVLinkBandwidth", &nr, &dist, 0) == 0 && nr >= 1 && dist != nullptr) {
    std::map<hwloc_obj_t, int> gpu_of;
    for (std::size_t g = 0; g < gpu_objs.size(); ++g) gpu_of[gpu_objs[g]] = static_cast<int>(g);
    std::vector<int> role(dist->nbobjs, -1);  // GPU index, or -2 for an NVSwitch
    for (unsigned i = 0; i < dist->nbobjs; ++i) {
      hwloc_obj_t o = dist->objs[i];
      hwloc_obj_t pci = pci_of(o);
      if (pci == nullptr) continue;
      if (auto it = gpu_of.find(pci); it != gpu_of.end()) {
        role[i] = it->second;
      } else if (is_nvswitch(pci)) {
        role[i] = -2;
      }
    }
    for (unsigned i = 0; i < dist->nbobjs; ++i) {
      int g = role[i];
      if (g < 0) continue;
      auto gen = detail::nvlink_generation(node.gpus[static_cast<std::size_t>(g)]);
      double link_mbps = gen ? gen->link_gbps * 1000 : 25000;
      graph.link_gbps[static_cast<std::size_t>(g)] = link_mbps / 1000;
      graph.version[static_cast<std::size_t>(g)] = gen ? gen->version : 0;
      for (unsigned j = 0; j < dist->nbobjs; ++j) {
        if (i == j || role[j] == -1) continue;
        double mbps = static_cast<double>(dist->values[i * dist->nbobjs + j]);
        if (mbps <= 0) continue;
        int links = std::max(1, static_cast<int>(std::lround(mbps / link_mbps)));
        if (role[j] == -2) {
          graph.to_switch[static_cast<std::size_t>(g)] += links;
        } else {
          graph.direct[static_cast<std::size_t>(g)][static_cast<std::size_t>(role[j])] += links;
        }
      }
    }
    hwloc_distances_release(t, dist);
    if (!graph.empty()) graph.source = NvlinkSource::kHwloc;
  }
  if (graph.empty() && nvml != nullptr && nvml->available) graph = detail::nvlink_from_nvml(node, *nvml);
  if (graph.empty()) graph = detail::infer_nvlink(node);
  detail::apply_nvlink(node, graph);
}

// Adds what NVML knows to the GPUs hwloc found: the driver's model name and the memory size.
void merge_nvml(NodeTopology& node, const NvmlReport& nvml) {
  node.nvml_available = nvml.available;
  node.nvml_status = nvml.status;
  if (!nvml.available) return;
  for (const auto& ng : nvml.gpus) {
    auto it =
        std::find_if(node.gpus.begin(), node.gpus.end(), [&](const Gpu& g) { return g.pci_bus_id == ng.pci_bus_id; });
    if (it == node.gpus.end()) {
      node.notes.push_back(
          fmt::format("NVML lists GPU {} ({}) that hwloc's PCI view lacks; it is left out", ng.pci_bus_id, ng.name));
      continue;
    }
    if (!ng.name.empty()) {
      it->model = ng.name;
      it->model_source = "nvml";
    }
    if (ng.memory_bytes > 0) {
      it->memory_bytes = ng.memory_bytes;
      it->memory_source = "nvml";
    }
  }
}

void finish_gpus(NodeTopology& node, const std::vector<hwloc_obj_t>& objs) {
  for (std::size_t g = 0; g < node.gpus.size(); ++g) {
    Gpu& gpu = node.gpus[g];
    gpu.catalog_name = detail::match_catalog(gpu);
    if (gpu.model.empty()) {
      const char* pci_name = info_of(objs[g], "PCIDevice");
      if (!gpu.catalog_name.empty()) {
        gpu.model = "NVIDIA " + gpu.catalog_name;
        gpu.model_source = "pci id";
      } else if (*pci_name != '\0') {
        gpu.model = pci_name;
        gpu.model_source = "pci name";
      } else {
        gpu.model = fmt::format("NVIDIA {:04x}:{:04x}", gpu.vendor_id, gpu.device_id);
        gpu.model_source = "pci id";
      }
    }
    if (gpu.memory_bytes == 0 && !gpu.catalog_name.empty()) {
      if (auto spec = find_gpu(gpu.catalog_name)) {
        gpu.memory_bytes = static_cast<std::uint64_t>(spec->memory_bytes());
        gpu.memory_source = "catalog";
      }
    }
  }
}

// hwloc reads NUMA sizes from the firmware tables, which some virtual machines fill wrongly (this project's CI VMs
// report 5 GB of 24). With one NUMA node, /proc/meminfo is the better figure.
void check_live_memory(NodeTopology& node) {
  if (node.numa_nodes.size() != 1) return;
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  while (in >> key) {
    if (key == "MemTotal:") {
      in >> kib;
      break;
    }
    in.ignore(1 << 12, '\n');
  }
  std::uint64_t bytes = kib * 1024;
  std::uint64_t& hw = node.numa_nodes[0].memory_bytes;
  if (bytes > 0 && (hw == 0 || bytes > hw + hw / 10 || bytes < hw - hw / 10)) {
    node.notes.push_back(fmt::format("hwloc reports {} on NUMA node {}, /proc/meminfo {}: using /proc/meminfo",
                                     format_bytes(static_cast<double>(hw)), node.numa_nodes[0].os_index,
                                     format_bytes(static_cast<double>(bytes))));
    hw = bytes;
  }
}

NodeTopology read_topology(hwloc_topology_t t, bool live, const NvmlReport* nvml) {
  Reader r{t, live, nvml, {}, {}, {}};
  hwloc_obj_t root = hwloc_get_root_obj(t);
  r.node.machine = info_of(root, "DMIProductName");
  r.node.hostname = info_of(root, "HostName");
  // An XML says which hwloc wrote it when that hwloc recorded it (2.x lstopo does; older exports may not).
  r.node.hwloc_version = live ? hwloc_library_version() : info_of(root, "hwlocVersion");
  read_cpu_side(t, r.node);
  r.read_gpus();
  if (nvml != nullptr) merge_nvml(r.node, *nvml);
  r.assign_orphan_gpu_osdevs();
  finish_gpus(r.node, r.gpu_objs);
  r.read_nvswitches();
  r.read_nics();
  r.compute_pci_affinity();
  r.read_nvlink();
  if (live) check_live_memory(r.node);
  detail::find_anomalies(r.node);
  return std::move(r.node);
}

// What we can tell about a file before hwloc sees it, so that the common mistakes get a message that says what to do
// rather than hwloc's "XML component discovery failed".
void check_xml_file(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string how = "write one on the node with `lstopo --whole-io --of xml node.xml`";
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (!fs::exists(st)) {
    throw input_error(fmt::format(
        "{}: no such file; give the path of an hwloc XML topology ({}), or leave out --xml to read this machine", path,
        how));
  }
  if (fs::is_directory(st)) {
    throw input_error(fmt::format("{}: is a directory, not an hwloc XML file ({})", path, how));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error(fmt::format("{}: cannot be read ({}); check its permissions", path, std::strerror(errno)));
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  std::size_t start = starts_with(head, "\xEF\xBB\xBF") ? 3 : 0;
  while (start < head.size() && std::isspace(static_cast<unsigned char>(head[start])) != 0) ++start;
  if (start >= head.size())
    throw input_error(fmt::format("{}: is empty; expected an hwloc XML topology ({})", path, how));
  if (head[start] != '<') {
    std::string shown = head.substr(start, 24);
    for (char& c : shown) {
      if (std::isprint(static_cast<unsigned char>(c)) == 0) c = '?';
    }
    throw input_error(
        fmt::format("{}: is not XML (it starts with \"{}\"); expected an hwloc XML topology ({})", path, shown, how));
  }
  std::size_t tag = head.find("<topology");
  if (tag == std::string::npos) {
    throw input_error(fmt::format(
        "{}: is XML but not an hwloc topology (no <topology> element in its first 4 KiB); expected the output of "
        "`lstopo --whole-io --of xml node.xml`",
        path));
  }
  std::size_t end = head.find('>', tag);
  std::string element = head.substr(tag, end == std::string::npos ? std::string::npos : end - tag);
  std::size_t v = element.find("version=\"");
  if (v != std::string::npos) {
    std::size_t vs = v + 9, ve = element.find('"', vs);
    std::string version = element.substr(vs, ve == std::string::npos ? std::string::npos : ve - vs);
    auto major = parse_int(version.substr(0, version.find('.')));
    if (major && *major >= 3) {
      throw input_error(fmt::format(
          "{}: is an hwloc {} XML topology, which hwloc {} (the version dtrain uses) cannot read; re-export it in the "
          "2.0 format with `lstopo --whole-io --of xml --export-xml-flags v2 node.xml` (hwloc 3.x), or with the "
          "lstopo of hwloc 2.x",
          path, version, hwloc_library_version()));
    }
  }
}

}  // namespace

NodeTopology load_topology_xml(const std::string& path) {
  check_xml_file(path);
  Topology topo;
  hwloc_topology_t t = topo.get();
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_set_xml(t, path.c_str()) != 0 || hwloc_topology_load(t) != 0) {
    int err = errno;
    throw input_error(fmt::format(
        "{}: hwloc {} could not read this XML topology ({}); check that it is a complete file written by `lstopo "
        "--whole-io --of xml`",
        path, hwloc_library_version(), std::strerror(err)));
  }
  int io = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PCI_DEVICE) + hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_OS_DEVICE) +
           hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_BRIDGE);
  if (io == 0) {
    throw input_error(fmt::format(
        "{}: has no I/O objects (no PCI devices, GPUs or NICs), so GPUs, NVLink and NICs cannot be seen; it was "
        "exported without I/O (lstopo --no-io). Re-export it on the node with `lstopo --whole-io --of xml node.xml`",
        path));
  }
  NodeTopology node = read_topology(t, false, nullptr);
  node.source = "xml";
  node.path = path;
  return node;
}

NodeTopology discover_node() {
  // hwloc itself honours HWLOC_XMLFILE; doing it here gives the file the same checks as --xml and a report that
  // says where the topology came from. Test clusters use it to give each fake node its own topology.
  if (const char* xml = std::getenv("HWLOC_XMLFILE"); xml != nullptr && *xml != '\0') {
    NodeTopology node = load_topology_xml(xml);
    node.notes.push_back(fmt::format("read from HWLOC_XMLFILE={} instead of this machine", xml));
    return node;
  }
  Topology topo;
  hwloc_topology_t t = topo.get();
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_load(t) != 0) {
    throw Error(ErrorCategory::kTopology, ExitCode::kFailure,
                fmt::format("hwloc could not read this machine's topology ({})", std::strerror(errno)));
  }
  NvmlReport nvml = query_nvml();
  NodeTopology node = read_topology(t, true, &nvml);
  node.source = "live";
  if (hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PCI_DEVICE) == 0) {
    node.notes.push_back(
        "hwloc sees no PCI device on this machine (a container without /sys/bus/pci?): GPUs and NICs cannot be seen");
  }
  return node;
}

NodeTopology load_node_topology(const std::string& xml_path) {
  return xml_path.empty() ? discover_node() : load_topology_xml(xml_path);
}

}  // namespace dtrain::topology
