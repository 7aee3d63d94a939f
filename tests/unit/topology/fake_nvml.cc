// A stand-in for libnvidia-ml.so.1 with the entry points dtrain resolves, so that the NVML path of node discovery runs
// on machines without a GPU. It describes an HGX H100 board: 8 GPUs, each with 18 NVLink4 links into NVSwitches,
// except GPU 3 whose link 17 is down. FAKE_NVML_MODE=direct describes two PCIe H100s joined by 4 direct links;
// FAKE_NVML_MODE=init_fails makes nvmlInit fail. Built with FAKE_NVML_OLD, it lacks nvmlDeviceGetPciInfo_v3, like a
// driver too old for dtrain.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {

using nvmlReturn_t = int;
struct nvmlDevice_st {
  int index;
};
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

}  // extern "C"

namespace {

constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kUninitialized = 1;
constexpr nvmlReturn_t kInvalidArgument = 2;
constexpr nvmlReturn_t kNotSupported = 3;

nvmlDevice_st g_devices[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
bool g_initialised = false;

bool direct_mode() {
  const char* m = std::getenv("FAKE_NVML_MODE");
  return m != nullptr && std::strcmp(m, "direct") == 0;
}
unsigned device_count() { return direct_mode() ? 2 : 8; }
// HGX H100 bus numbers, as on a DGX H100.
constexpr unsigned kBus[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

void fill_pci(nvmlPciInfo_t* pci, unsigned bus, unsigned device_id) {
  std::memset(pci, 0, sizeof(*pci));
  pci->domain = 0;
  pci->bus = bus;
  pci->device = 0;
  pci->pciDeviceId = (device_id << 16) | 0x10de;
  std::snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", bus);
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", bus);
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlInit_v2() {
  const char* m = std::getenv("FAKE_NVML_MODE");
  if (m != nullptr && std::strcmp(m, "init_fails") == 0) return 9;  // NVML_ERROR_DRIVER_NOT_LOADED
  g_initialised = true;
  return kSuccess;
}

nvmlReturn_t nvmlShutdown() {
  g_initialised = false;
  return kSuccess;
}

const char* nvmlErrorString(nvmlReturn_t rc) { return rc == 9 ? "Driver Not Loaded" : "Unknown Error"; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!g_initialised) return kUninitialized;
  *count = device_count();
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!g_initialised) return kUninitialized;
  if (index >= device_count()) return kInvalidArgument;
  *device = &g_devices[index];
  return kSuccess;
}

#ifndef FAKE_NVML_OLD
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  fill_pci(pci, kBus[device->index], direct_mode() ? 0x2331 : 0x2330);
  return kSuccess;
}
#endif

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t, char* name, unsigned int length) {
  std::snprintf(name, length, "%s", direct_mode() ? "NVIDIA H100 PCIe" : "NVIDIA H100 80GB HBM3");
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t* memory) {
  memory->total = 85520809984ULL;  // 81559 MiB, what nvidia-smi shows on an H100 SXM
  memory->free = memory->total;
  memory->used = 0;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int* is_active) {
  unsigned links = direct_mode() ? 4 : 18;
  if (link >= links) return kInvalidArgument;
  *is_active = (!direct_mode() && device->index == 3 && link == 17) ? 0 : 1;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t, unsigned int, unsigned int* version) {
  *version = 4;
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t* pci) {
  if (direct_mode()) {
    fill_pci(pci, kBus[1 - device->index], 0x2331);
    return kSuccess;
  }
  if (link >= 18) return kNotSupported;
  // Four NVSwitches, on buses 0x05..0x08 (not GPUs of this node).
  fill_pci(pci, 0x05 + link % 4, 0x22a3);
  return kSuccess;
}

}  // extern "C"
