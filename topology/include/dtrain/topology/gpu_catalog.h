// The built-in catalog of accelerators the planner knows: peak dense rates per dtype, memory, HBM bandwidth, and the
// calibration defaults for that GPU type (GEMM efficiency curve, achieved HBM fraction, attention kernel efficiency).
//
// Figures are datasheet numbers (NVIDIA A100/H100/H200/V100/L40S datasheets; tests/data/published/hardware.md);
// memory is what the driver reports (nvidia-smi), in GiB. Calibration is one set of constants per GPU type, fitted
// once against published end-to-end runs (docs/cost-model.md#calibration), never per model.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/common/dtype.h"

namespace dtrain::topology {

// How well a GPU type turns its peak into delivered work. A cluster.toml [calibration] table overrides any field.
struct Calibration {
  // GEMM efficiency as a function of the GEMM's FLOPs F: gemm_efficiency_max * F / (F + gemm_half_gflop * 1e9).
  // Small GEMMs run far below peak (launch and wave-quantisation overheads); large ones approach the maximum.
  double gemm_efficiency_max = 0.85;
  double gemm_half_gflop = 1.0;
  // Fraction of peak a fused attention kernel reaches (flash attention).
  double attention_efficiency = 0.6;
  // Measured by dtplan calibrate on CPUs: the fused attention kernel's fraction of peak by sequence length, its
  // forward and its backward pass apart (the backward's FLOPs taken as the layer graph's backward_factor times the
  // forward's). Log-linear between the lengths, the end values beyond them. Empty: attention_efficiency for both.
  std::vector<double> attention_seq;  // ascending
  std::vector<double> attention_forward_efficiency;
  std::vector<double> attention_backward_efficiency;
  double attention_efficiency_at(double seq_len, bool backward) const;
  // Fraction of HBM bandwidth reached by elementwise kernels (norms, activations, softmax, optimizer).
  double hbm_efficiency = 0.75;
  // The same for the optimizer step alone (AdamW: one long streaming pass, faster per byte than a layer's many small
  // kernels); 0: hbm_efficiency. dtplan calibrate measures it.
  double optimizer_hbm_efficiency = 0;
  // Fixed time per optimizer step outside the model (data loading, logging, launch gaps, synchronisation).
  double step_overhead_s = 0.05;
  // Time lost per micro-batch per pipeline stage (kernel launch gaps, host scheduling).
  double microbatch_overhead_s = 0.0005;
  // The least time one op of the model's graph takes in a forward (backward) pass on this device: the host's work to
  // issue its kernels and their launches. A pass over a layer takes at least its op count times this, which is what
  // sets the pace of a small model on a GPU (the kernels finish faster than the host issues them). 0: no floor (the
  // catalog; a CPU, where the host is the device). dtplan calibrate --device cuda measures it.
  double host_op_forward_us = 0;
  double host_op_backward_us = 0;
  // Memory lost to the allocator's fragmentation, as a fraction of what tensors use.
  double memory_fragmentation = 0.05;
  // Memory the runtime takes before any tensor: CUDA context, cuBLAS workspaces, NCCL buffers.
  double runtime_reserved_gib = 2.0;
  double runtime_reserved_bytes() const { return runtime_reserved_gib * 1024.0 * 1024.0 * 1024.0; }
  // Mixture of experts with ep > 1: the routed rows the busiest expert-parallel rank gets, over the mean (1: the
  // router balances perfectly). Scales that rank's expert GEMMs and all-to-all bytes. Measured routing (Switch,
  // Mixtral, DeepSeek) is 1.1-1.5 early in training and nearer 1 with a load-balancing loss.
  double moe_imbalance = 1.0;
  // The experts' grouped GEMMs' rate against plain GEMMs of the same shapes (the curve above), which prices each
  // expert's GEMM; 1: the same. dtplan calibrate --device cuda measures it.
  double expert_gemm_efficiency = 1.0;
  // FP8 GEMMs ([training] fp8): their efficiency against the GEMM curve above at the same FLOPs, applied to the GPU's
  // FP8 peak (tflops_fp8). 0: not given, kDefaultFp8GemmEfficiency. On a CPU, whose FP8 GEMMs are emulated by fp32
  // ones, 1 with tflops_fp8 = tflops_fp32.
  double fp8_gemm_efficiency = 0;
  double fp8_gemm_efficiency_or_default() const;
  // CPU ranks sharing fewer cores ([node] cores): the fraction of a waiting rank's share of the cores that the busy
  // ranks take up (1: all of it, as a scheduler in theory would; 0: none). dtplan calibrate fits it to a pipeline run.
  double idle_core_reclaim = 1.0;
};

// FP8 GEMMs reach a smaller share of their (twice as high) peak than bf16 GEMMs of the same shapes: cuBLASLt's FP8
// GEMMs on an H100 run at about 1.6 times its bf16 GEMMs' rate on large shapes, not 2 (docs/cost-model.md#fp8).
inline constexpr double kDefaultFp8GemmEfficiency = 0.8;

// ys at x, log-linear in x between the points of ascending, non-empty xs; the end values beyond them.
double log_interpolate(const std::vector<double>& xs, const std::vector<double>& ys, double x);

struct GpuSpec {
  std::string name;
  double tflops_bf16 = 0;  // dense tensor-core peak; 0 = not supported
  double tflops_fp16 = 0;
  double tflops_fp8 = 0;
  double tflops_fp32 = 0;  // what fp32 GEMMs run at (TF32 tensor cores where the GPU has them)
  double memory_gib = 0;
  double hbm_gbps = 0;  // GB/s
  Calibration calibration;

  // Peak rate for GEMMs in this dtype, FLOP/s; 0 when the GPU has no such mode.
  double peak_flops(DType dtype) const;
  double memory_bytes() const { return memory_gib * 1024.0 * 1024.0 * 1024.0; }
};

// The catalog entry for `name` (exact match, case-insensitive, also accepting common aliases such as "A100-80GB",
// "H100"); nullopt when unknown.
std::optional<GpuSpec> find_gpu(std::string_view name);
std::vector<std::string> catalog_names();

}  // namespace dtrain::topology
