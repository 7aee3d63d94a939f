// RDMA NICs: their kind, their port states and link rates from sysfs, and nominal rates of known adapters.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/common/strings.h"
#include "topology_internal.h"

namespace dtrain::topology {

std::string_view to_string(NicKind kind) {
  switch (kind) {
    case NicKind::kInfiniBand:
      return "infiniband";
    case NicKind::kRoce:
      return "roce";
    case NicKind::kEfa:
      return "efa";
    case NicKind::kRdma:
      return "rdma";
  }
  return "rdma";
}

namespace {
constexpr int kPortActive = 4;
constexpr int kPortActiveDefer = 5;
bool active(int state) { return state == kPortActive || state == kPortActiveDefer; }
}  // namespace

bool Nic::usable() const {
  if (ports.empty()) return true;
  return std::any_of(ports.begin(), ports.end(), [](const NicPort& p) { return active(p.state); });
}

int Nic::port() const {
  for (const auto& p : ports) {
    if (active(p.state)) return p.number;
  }
  return ports.empty() ? 1 : ports.front().number;
}

std::string Nic::state_name() const {
  if (ports.empty()) return "unknown";
  int best = 0;
  for (const auto& p : ports) {
    if (active(p.state)) return "active";
    best = std::max(best, p.state);
  }
  switch (best) {
    case 1:
      return "down";
    case 2:
      return "init";
    case 3:
      return "armed";
    default:
      return "unknown";
  }
}

namespace detail {

NicKind nic_kind(std::string_view name, unsigned vendor_id, unsigned pci_class, const std::vector<std::string>& netdevs,
                 std::string_view link_layer) {
  constexpr unsigned kAmazon = 0x1d0f;
  if (vendor_id == kAmazon || starts_with(name, "efa") || starts_with(name, "rdmap")) return NicKind::kEfa;
  if (link_layer == "InfiniBand") return NicKind::kInfiniBand;
  if (link_layer == "Ethernet") return NicKind::kRoce;
  // PCI classes: 0x0207 InfiniBand network controller, 0x0c06 InfiniBand serial bus controller, 0x0200 Ethernet.
  if (pci_class == 0x0207 || pci_class == 0x0c06) return NicKind::kInfiniBand;
  for (const auto& n : netdevs) {
    if (starts_with(n, "ib")) return NicKind::kInfiniBand;
  }
  if (pci_class == 0x0200) return NicKind::kRoce;
  return NicKind::kRdma;
}

std::optional<NicRate> nominal_nic_rate(unsigned vendor_id, unsigned device_id) {
  // Line rates of the adapters' fastest mode, in Gb/s; an XML does not record the negotiated rate.
  struct Known {
    unsigned vendor, device;
    double gbit;
    const char* what;
  };
  static constexpr Known kKnown[] = {
      {0x1d0f, 0xefa0, 100, "AWS EFA (first generation, p4d: 4 x 100 Gb/s)"},
      {0x15b3, 0x1013, 100, "Mellanox ConnectX-4 (EDR, 100 Gb/s)"},
      {0x15b3, 0x1017, 100, "Mellanox ConnectX-5 (EDR, 100 Gb/s)"},
      {0x15b3, 0x101b, 200, "Mellanox ConnectX-6 (HDR, 200 Gb/s)"},
      {0x15b3, 0x1021, 400, "NVIDIA ConnectX-7 (NDR, 400 Gb/s)"},
  };
  for (const auto& k : kKnown) {
    if (k.vendor == vendor_id && k.device == device_id) {
      return NicRate{k.gbit / 8.0, fmt::format("nominal rate of PCI {:04x}:{:04x}, {}", vendor_id, device_id, k.what)};
    }
  }
  return std::nullopt;
}

double parse_sysfs_rate_gbps(std::string_view rate_text) {
  // "200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)"
  std::string text(trim(rate_text));
  std::istringstream in(text);
  double gbit = 0;
  std::string unit;
  if (!(in >> gbit >> unit) || gbit <= 0) return 0;
  if (unit.rfind("Gb/s", 0) != 0) return 0;
  return gbit / 8.0;
}

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.pop_back();
  return s;
}

bool read_sysfs_nic(const std::string& sysfs_root, Nic& nic, std::string& link_layer) {
  namespace fs = std::filesystem;
  fs::path ports_dir = fs::path(sysfs_root) / nic.name / "ports";
  std::error_code ec;
  if (!fs::is_directory(ports_dir, ec)) return false;
  std::vector<int> numbers;
  for (const auto& e : fs::directory_iterator(ports_dir, ec)) {
    if (auto n = parse_int(e.path().filename().string())) numbers.push_back(static_cast<int>(*n));
  }
  std::sort(numbers.begin(), numbers.end());
  for (int number : numbers) {
    fs::path dir = ports_dir / std::to_string(number);
    auto it = std::find_if(nic.ports.begin(), nic.ports.end(), [&](const NicPort& p) { return p.number == number; });
    if (it == nic.ports.end()) {
      nic.ports.push_back(NicPort{number, 0, 0, ""});
      it = std::prev(nic.ports.end());
    }
    // "4: ACTIVE"
    if (auto state = read_text_file((dir / "state").string())) {
      if (auto code = parse_int(state->substr(0, state->find(':')))) it->state = static_cast<int>(*code);
    }
    if (auto rate = read_text_file((dir / "rate").string())) {
      it->rate_text = *rate;
      it->gbps = parse_sysfs_rate_gbps(*rate);
    }
    if (link_layer.empty()) {
      if (auto ll = read_text_file((dir / "link_layer").string())) link_layer = *ll;
    }
  }
  std::sort(nic.ports.begin(), nic.ports.end(), [](const NicPort& a, const NicPort& b) { return a.number < b.number; });
  double best = 0;
  for (const auto& p : nic.ports) {
    if (active(p.state)) best = std::max(best, p.gbps);
  }
  if (best > 0) {
    nic.gbps = best;
    nic.gbps_source = "sysfs";
  }
  return true;
}

}  // namespace detail
}  // namespace dtrain::topology
