// NVML at run time: what the NVIDIA driver's management library says about the node's GPUs — names, memory, and
// every active NVLink with its version and the PCI address of its far end (a peer GPU or an NVSwitch).
//
// Nothing links against NVML: the library is opened with dlopen("libnvidia-ml.so.1") when asked, so dtrain builds
// and runs on machines without the NVIDIA driver (CI, laptops, CPU nodes). Debian's hwloc 2.9 has no NVML plugin,
// which is why dtrain queries NVML itself on a live GPU node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::topology {

struct NvmlLink {
  int link = 0;                       // the link number on this GPU
  int version = 0;                    // as nvmlDeviceGetNvLinkVersion returns it; 0 when it failed
  std::string remote_pci_bus_id;      // normalized ("0000:07:00.0"); "" when NVML did not say
  unsigned remote_pci_device_id = 0;  // (device id << 16) | vendor id, as NVML packs it; 0 when unknown
};

struct NvmlGpu {
  int index = 0;                       // NVML's index
  std::string pci_bus_id;              // normalized ("0000:07:00.0")
  std::string name;                    // "NVIDIA H100 80GB HBM3"
  std::uint64_t memory_bytes = 0;      // total framebuffer memory
  std::vector<NvmlLink> active_links;  // links in state enabled
};

struct NvmlReport {
  bool available = false;  // the library loaded, initialised and listed the GPUs
  std::string status;      // why not, or "NVML <n> GPUs" when it worked
  std::vector<NvmlGpu> gpus;
};

// Loads `library` with dlopen, initialises NVML, reads every GPU, shuts NVML down and closes the library. Never
// throws: a missing library, a missing symbol or a failing call gives available = false with the reason in status.
NvmlReport query_nvml(const std::string& library = "libnvidia-ml.so.1");

}  // namespace dtrain::topology
