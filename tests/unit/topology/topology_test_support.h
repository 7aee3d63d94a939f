// Paths of the topology fixtures and what this machine's sysfs says, for the topology tests.
#pragma once

#include <dirent.h>

#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace dtrain::topology::testing {

inline std::string fixture(const std::string& name) {
  return std::string(DTRAIN_SOURCE_DIR) + "/tests/data/topologies/" + name;
}

inline const std::string kDgx2 = "hwloc-nvidiaDGX2.xml";
inline const std::string kP4d = "aws-p4d.24xlarge.xml";
inline const std::string kWholeIo = "hwloc-32em64t-2n8c2t-pci-wholeio.xml";
inline const std::string k24em64t = "hwloc-24em64t-2n6c2t-pci.xml";

inline std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Entries of a directory whose names start with `prefix`.
inline std::set<std::string> entries(const std::string& dir, const std::string& prefix) {
  std::set<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind(prefix, 0) == 0) out.insert(n);
    }
    closedir(d);
  }
  return out;
}

// What the kernel says about this machine, independently of hwloc: online CPUs, distinct (package, core) pairs,
// NUMA nodes, and NVIDIA display-class PCI devices.
struct SysfsFacts {
  int pus = 0;
  int cores = 0;
  int numa_nodes = 0;
  int nvidia_gpus = 0;
};

inline SysfsFacts sysfs_facts() {
  SysfsFacts f;
  std::set<std::pair<std::string, std::string>> cores;
  for (const auto& cpu : entries("/sys/devices/system/cpu", "cpu")) {
    std::string rest = cpu.substr(3);
    if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string base = "/sys/devices/system/cpu/" + cpu;
    if (read_line(base + "/online") == "0") continue;
    std::string core = read_line(base + "/topology/core_id");
    if (core.empty()) continue;  // offline CPUs have no topology directory
    ++f.pus;
    cores.insert({read_line(base + "/topology/physical_package_id"), core});
  }
  f.cores = static_cast<int>(cores.size());
  for (const auto& n : entries("/sys/devices/system/node", "node")) {
    if (n.size() > 4 && n.find_first_not_of("0123456789", 4) == std::string::npos) ++f.numa_nodes;
  }
  if (f.numa_nodes == 0) f.numa_nodes = 1;  // kernels without NUMA support still have one memory node
  for (const auto& dev : entries("/sys/bus/pci/devices", "")) {
    if (dev == "." || dev == "..") continue;
    std::string base = "/sys/bus/pci/devices/" + dev;
    if (read_line(base + "/vendor") == "0x10de" && read_line(base + "/class").rfind("0x03", 0) == 0) ++f.nvidia_gpus;
  }
  return f;
}

}  // namespace dtrain::topology::testing
