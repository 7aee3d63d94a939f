// NVML through dlopen: the few types and entry points dtrain needs, declared here with nvml.h's exact layout so that
// no NVIDIA header or library is needed to build.
#include "dtrain/topology/nvml.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstddef>
#include <cstring>

#include "dtrain/topology/node_topology.h"

namespace dtrain::topology {
namespace {

// ---- ABI of libnvidia-ml.so.1 (nvml.h, CUDA 11 to 13; unchanged since the _v2/_v3 entry points appeared) ----
using nvmlReturn_t = int;  // an enum in nvml.h: int-sized, NVML_SUCCESS = 0
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
using nvmlEnableState_t = int;  // NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1
constexpr nvmlEnableState_t kNvmlFeatureEnabled = 1;

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 and nvmlDeviceGetNvLinkRemotePciInfo_v2 fill it.
struct nvmlPciInfo_t {
  char busIdLegacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;  // (device id << 16) | vendor id
  unsigned int pciSubSystemId;
  char busId[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: "00000000:07:00.0"
};
static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlPciInfo_t) == 68);
static_assert(offsetof(nvmlPciInfo_t, pciDeviceId) == 28);
static_assert(offsetof(nvmlPciInfo_t, busId) == 36);

constexpr unsigned kNvmlDeviceNameBufferSize = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kNvmlNvlinkMaxLinks = 18;        // NVML_NVLINK_MAX_LINKS (H100: 18)

struct NvmlApi {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*get_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*get_handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_pci_info)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*get_memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*get_nvlink_state)(nvmlDevice_t, unsigned int, nvmlEnableState_t*) = nullptr;
  nvmlReturn_t (*get_nvlink_version)(nvmlDevice_t, unsigned int, unsigned int*) = nullptr;
  nvmlReturn_t (*get_nvlink_remote_pci_info)(nvmlDevice_t, unsigned int, nvmlPciInfo_t*) = nullptr;
};

// Closes the library on every path out of query_nvml.
class Library {
 public:
  explicit Library(const std::string& name) : handle_(dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {}
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  void* handle() const { return handle_; }

  // Resolves `symbol` into `fn`; false when the library lacks it.
  template <typename Fn>
  bool resolve(const char* symbol, Fn& fn) const {
    void* p = dlsym(handle_, symbol);
    if (p == nullptr) return false;
    // POSIX guarantees that a data pointer from dlsym converts to a function pointer.
    static_assert(sizeof(p) == sizeof(fn));
    std::memcpy(&fn, &p, sizeof(fn));
    return true;
  }

 private:
  void* handle_;
};

std::string bus_id_of(const nvmlPciInfo_t& pci) {
  std::string text(pci.busId, strnlen(pci.busId, sizeof(pci.busId)));
  if (text.empty()) text = std::string(pci.busIdLegacy, strnlen(pci.busIdLegacy, sizeof(pci.busIdLegacy)));
  if (text.empty()) return format_pci_bus_id(pci.domain, pci.bus, pci.device, 0);
  return normalize_pci_bus_id(text);
}

}  // namespace

NvmlReport query_nvml(const std::string& library) {
  NvmlReport report;
  Library lib(library);
  if (lib.handle() == nullptr) {
    const char* why = dlerror();
    report.status = fmt::format("{} not loaded ({}): no NVIDIA driver on this machine", library,
                                why != nullptr ? why : "dlopen failed");
    return report;
  }
  NvmlApi api;
  struct Entry {
    const char* symbol;
    bool ok;
  };
  const Entry required[] = {
      {"nvmlInit_v2", lib.resolve("nvmlInit_v2", api.init)},
      {"nvmlShutdown", lib.resolve("nvmlShutdown", api.shutdown)},
      {"nvmlDeviceGetCount_v2", lib.resolve("nvmlDeviceGetCount_v2", api.get_count)},
      {"nvmlDeviceGetHandleByIndex_v2", lib.resolve("nvmlDeviceGetHandleByIndex_v2", api.get_handle_by_index)},
      {"nvmlDeviceGetPciInfo_v3", lib.resolve("nvmlDeviceGetPciInfo_v3", api.get_pci_info)},
      {"nvmlDeviceGetName", lib.resolve("nvmlDeviceGetName", api.get_name)},
  };
  for (const auto& e : required) {
    if (!e.ok) {
      report.status = fmt::format("{} lacks {} (driver too old?)", library, e.symbol);
      return report;
    }
  }
  // Optional: without them the report only lacks memory sizes or NVLink.
  lib.resolve("nvmlErrorString", api.error_string);
  lib.resolve("nvmlDeviceGetMemoryInfo", api.get_memory_info);
  bool have_nvlink = lib.resolve("nvmlDeviceGetNvLinkState", api.get_nvlink_state) &&
                     lib.resolve("nvmlDeviceGetNvLinkVersion", api.get_nvlink_version) &&
                     lib.resolve("nvmlDeviceGetNvLinkRemotePciInfo_v2", api.get_nvlink_remote_pci_info);
  auto error_text = [&](nvmlReturn_t rc) {
    const char* s = api.error_string != nullptr ? api.error_string(rc) : nullptr;
    return s != nullptr ? std::string(s) : fmt::format("NVML error {}", rc);
  };

  if (nvmlReturn_t rc = api.init(); rc != kNvmlSuccess) {
    report.status = fmt::format("nvmlInit failed: {}", error_text(rc));
    return report;
  }
  unsigned int count = 0;
  if (nvmlReturn_t rc = api.get_count(&count); rc != kNvmlSuccess) {
    report.status = fmt::format("nvmlDeviceGetCount failed: {}", error_text(rc));
    api.shutdown();
    return report;
  }
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (api.get_handle_by_index(i, &dev) != kNvmlSuccess) continue;
    NvmlGpu gpu;
    gpu.index = static_cast<int>(i);
    nvmlPciInfo_t pci{};
    if (api.get_pci_info(dev, &pci) == kNvmlSuccess) gpu.pci_bus_id = bus_id_of(pci);
    char name[kNvmlDeviceNameBufferSize] = {};
    if (api.get_name(dev, name, sizeof(name)) == kNvmlSuccess)
      gpu.name = std::string(name, strnlen(name, sizeof(name)));
    nvmlMemory_t mem{};
    if (api.get_memory_info != nullptr && api.get_memory_info(dev, &mem) == kNvmlSuccess) gpu.memory_bytes = mem.total;
    for (unsigned int link = 0; have_nvlink && link < kNvmlNvlinkMaxLinks; ++link) {
      nvmlEnableState_t state = 0;
      // An error means the GPU has no link with this number (or no NVLink at all): stop, as hwloc does.
      if (api.get_nvlink_state(dev, link, &state) != kNvmlSuccess) break;
      if (state != kNvmlFeatureEnabled) continue;
      NvmlLink l;
      l.link = static_cast<int>(link);
      unsigned int version = 0;
      if (api.get_nvlink_version(dev, link, &version) == kNvmlSuccess) l.version = static_cast<int>(version);
      nvmlPciInfo_t remote{};
      if (api.get_nvlink_remote_pci_info(dev, link, &remote) == kNvmlSuccess) {
        l.remote_pci_bus_id = bus_id_of(remote);
        l.remote_pci_device_id = remote.pciDeviceId;
      }
      gpu.active_links.push_back(std::move(l));
    }
    report.gpus.push_back(std::move(gpu));
  }
  api.shutdown();
  report.available = true;
  report.status = fmt::format("{} GPU(s)", report.gpus.size());
  return report;
}

}  // namespace dtrain::topology
