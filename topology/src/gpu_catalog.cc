#include "dtrain/topology/gpu_catalog.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "dtrain/common/strings.h"

namespace dtrain::topology {

double log_interpolate(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  if (x <= xs.front()) return ys.front();
  if (x >= xs.back()) return ys.back();
  const auto i = static_cast<std::size_t>(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin());
  const double x0 = std::log(xs[i - 1]), x1 = std::log(xs[i]);
  const double w = (std::log(x) - x0) / (x1 - x0);
  return ys[i - 1] + w * (ys[i] - ys[i - 1]);
}

double Calibration::attention_efficiency_at(double seq_len, bool backward) const {
  if (attention_seq.empty()) return attention_efficiency;
  return log_interpolate(attention_seq, backward ? attention_backward_efficiency : attention_forward_efficiency,
                         seq_len);
}

double Calibration::fp8_gemm_efficiency_or_default() const {
  return fp8_gemm_efficiency > 0 ? fp8_gemm_efficiency : kDefaultFp8GemmEfficiency;
}

double GpuSpec::peak_flops(DType dtype) const {
  switch (dtype) {
    case DType::kBf16:
      return tflops_bf16 * 1e12;
    case DType::kFp16:
      return tflops_fp16 * 1e12;
    case DType::kFp8:
      return tflops_fp8 * 1e12;
    case DType::kFp32:
      return tflops_fp32 * 1e12;
    case DType::kUint8:
    case DType::kInt32:
    case DType::kInt64:
      return 0;  // not a training format: no GEMM runs on it
  }
  return 0;
}

namespace {

// A100 calibration: fitted on Megatron-LM SC'21 Table 1 and Korthikanti et al. 2022 Table 5 together
// (tests/unit/plan/calibration_test.cc holds both tables; docs/cost-model.md#calibration explains the fit).
Calibration a100_calibration() {
  Calibration c;
  c.gemm_efficiency_max = 0.76;
  c.gemm_half_gflop = 2.0;
  c.attention_efficiency = 0.55;
  c.hbm_efficiency = 0.80;
  c.step_overhead_s = 0.05;
  c.microbatch_overhead_s = 0.002;
  return c;
}

// Hopper, measured with dtrain's own executor on an H200 (bench/gpu.sh, 2026-11-26; docs/cost-model.md#hopper):
// cuBLASLt bf16 GEMMs of 4096^3 to 8192^3 ran at 656-803 TFLOP/s, 0.74-0.76 of the 989 peak averaged over a linear
// layer's forward, input-gradient and weight-gradient products, already at 137 GFLOP (so a small half-size); the
// tensor-core attention kernels 244 TFLOP/s forward and 185 backward at sequence 4096 (0.20 over a step's 2:5 mix);
// AdamW moved 3.79-3.84 TB/s of the H200's 4.8 (0.79).
Calibration hopper_calibration() {
  Calibration c;
  c.gemm_efficiency_max = 0.755;
  c.gemm_half_gflop = 1.0;
  c.attention_efficiency = 0.2;
  c.hbm_efficiency = 0.79;
  c.step_overhead_s = 0.05;
  c.microbatch_overhead_s = 0.0003;
  return c;
}

std::vector<GpuSpec> build_catalog() {
  std::vector<GpuSpec> cat;
  auto add = [&](std::string name, double bf16, double fp16, double fp8, double fp32, double mem_gib, double hbm,
                 Calibration cal) {
    GpuSpec g;
    g.name = std::move(name);
    g.tflops_bf16 = bf16;
    g.tflops_fp16 = fp16;
    g.tflops_fp8 = fp8;
    g.tflops_fp32 = fp32;
    g.memory_gib = mem_gib;
    g.hbm_gbps = hbm;
    g.calibration = std::move(cal);
    cat.push_back(g);
  };
  // A100: 312 TFLOP/s bf16/fp16, TF32 156; HBM2 1555 GB/s (40 GB), HBM2e 2039 GB/s (80 GB SXM), 1935 GB/s (PCIe).
  add("A100-SXM4-40GB", 312, 312, 0, 156, 40, 1555, a100_calibration());
  add("A100-SXM4-80GB", 312, 312, 0, 156, 80, 2039, a100_calibration());
  add("A100-PCIE-40GB", 312, 312, 0, 156, 40, 1555, a100_calibration());
  add("A100-PCIE-80GB", 312, 312, 0, 156, 80, 1935, a100_calibration());
  // H100 SXM: 989 bf16, 1979 fp8, TF32 494.7; 80 GB HBM3 at 3.35 TB/s (81559 MiB visible). PCIe: 756/1513, 2 TB/s.
  add("H100-SXM", 989, 989, 1979, 494.7, 79.65, 3350, hopper_calibration());
  add("H100-PCIE", 756, 756, 1513, 378, 79.65, 2000, hopper_calibration());
  // H200: H100 compute with 141 GB HBM3e at 4.8 TB/s (143771 MiB visible).
  add("H200", 989, 989, 1979, 494.7, 140.4, 4800, hopper_calibration());
  // V100: 125 TFLOP/s fp16 tensor cores (130 for the SXM3-H of the DGX-2H), no bf16, 900 GB/s HBM2.
  add("V100-SXM2-32GB", 0, 125, 0, 15.7, 32, 900, a100_calibration());
  add("V100-SXM3-32GB", 0, 130, 0, 16.4, 32, 981, a100_calibration());
  // L40S: 362 dense fp16/bf16, 733 fp8, 48 GB GDDR6 at 864 GB/s.
  add("L40S", 362, 362, 733, 183, 44.99, 864, hopper_calibration());
  return cat;
}

const std::vector<GpuSpec>& catalog() {
  static const std::vector<GpuSpec> cat = build_catalog();
  return cat;
}

struct Alias {
  const char* alias;
  const char* name;
};
constexpr Alias kAliases[] = {
    {"a100", "A100-SXM4-80GB"},
    {"a100-80gb", "A100-SXM4-80GB"},
    {"a100-40gb", "A100-SXM4-40GB"},
    {"a100-sxm4-80g", "A100-SXM4-80GB"},
    {"a100-sxm-80gb", "A100-SXM4-80GB"},
    {"h100", "H100-SXM"},
    {"h100-sxm5", "H100-SXM"},
    {"h100-80gb-hbm3", "H100-SXM"},
    {"h100-sxm5-80gb", "H100-SXM"},
    {"h200-sxm", "H200"},
    {"v100", "V100-SXM2-32GB"},
    {"tesla-v100-sxm3-32gb-h", "V100-SXM3-32GB"},
    {"v100-sxm3-32gb-h", "V100-SXM3-32GB"},
    {"a100-80gb-pcie", "A100-PCIE-80GB"},
    // PCI vendor:device ids, for GPUs seen only on the PCI bus (no driver name in the topology).
    {"10de:20b0", "A100-SXM4-40GB"},
    {"10de:20b2", "A100-SXM4-80GB"},
    {"10de:20f1", "A100-PCIE-40GB"},
    {"10de:20b5", "A100-PCIE-80GB"},
    {"10de:2330", "H100-SXM"},
    {"10de:2331", "H100-PCIE"},
    {"10de:2335", "H200"},
    {"10de:1db8", "V100-SXM3-32GB"},
    {"10de:1db5", "V100-SXM2-32GB"},
    {"10de:26b9", "L40S"},
};

}  // namespace

std::optional<GpuSpec> find_gpu(std::string_view name) {
  std::string key = lowercase(name);
  for (char& c : key) {
    if (c == ' ' || c == '_') c = '-';
  }
  // Drivers prefix the names they report: "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM3-32GB-H".
  for (std::string_view prefix : {"nvidia-", "tesla-"}) {
    if (starts_with(key, prefix) && key.size() > prefix.size()) key.erase(0, prefix.size());
  }
  for (const auto& g : catalog()) {
    if (lowercase(g.name) == key) return g;
  }
  for (const auto& a : kAliases) {
    if (key == a.alias) return find_gpu(a.name);
  }
  return std::nullopt;
}

std::vector<std::string> catalog_names() {
  std::vector<std::string> names;
  for (const auto& g : catalog()) names.push_back(g.name);
  return names;
}

}  // namespace dtrain::topology
