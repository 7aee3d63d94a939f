// The cost model's FP8 terms ([training] fp8; docs/cost-model.md#fp8): FP8 GEMMs at the GPU's FP8 peak, the casts
// of their operands, the weights' casts and the amax reductions once per step, and the FP8 weight copies in memory
// (stage_memory). Transformer Engine's way: FP8 inside the GEMMs of the transformer layers, bf16 between them.
#include <algorithm>
#include <cmath>

#include "dtrain/plan/cost_model.h"

namespace dtrain::plan {

double CostModel::fp8_gemm_seconds(double m, double n, double k) const {
  const auto& gpu = cluster_.node.gpu;
  const auto& cal = gpu.calibration;
  const double flops = 2.0 * m * n * k;
  const double eff =
      cal.gemm_efficiency_max * flops / (flops + cal.gemm_half_gflop * 1e9) * cal.fp8_gemm_efficiency_or_default();
  const double compute = flops / (gpu.peak_flops(DType::kFp8) * eff);
  return std::max(compute, memory_seconds(m * k + k * n + 2.0 * m * n));
}

double CostModel::fp8_cast_seconds(double elements) const {
  return memory_seconds(elements * (activation_bytes(model_.training.dtype) + 2.0));
}

double CostModel::fp8_weight_params(const ParallelConfig& c, int stage) const {
  if (!fp8_) return 0;
  const int layers = c.stage_layers(stage);
  const int moe = graph_.moe.empty() ? 0 : stage_moe_layers(c, stage);
  const double tp = c.tp;
  // The layers' parameters less the replicated ones (norms, row-parallel biases, the router): their linear layers.
  return static_cast<double>(layers - moe) * layer_params_sharded_ / tp +
         static_cast<double>(moe) *
             (moe_params_sharded_ / tp + moe_shared_params_ / moe_tp(c) + moe_layer_expert_params(c));
}

double CostModel::fp8_step_seconds(const ParallelConfig& c, int stage) const {
  if (!fp8_) return 0;
  double s = fp8_cast_seconds(fp8_weight_params(c, stage));
  if (model_.training.fp8_recipe == model::Fp8Recipe::kDelayed && c.tp * c.dp_cp() > 1) {
    // Three amaxes (input, weight, output gradient) per FP8 GEMM of the stage's layers, fp32, in one all-reduce.
    int gemms = 0;
    for (const model::Op& op : graph_.layer) gemms += fp8_gemm(op) ? 1 : 0;
    const double bytes = 3.0 * 4.0 * gemms * c.stage_layers(stage);
    GroupGeometry g;
    g.size = c.tp * c.dp_cp();
    g.per_node = std::min(g.size, cluster_.node.gpus);
    g.nodes = (g.size + g.per_node - 1) / g.per_node;
    g.nvlink = g.per_node <= cluster_.node.nvlink_domain;
    s += all_reduce_seconds(bytes, g);
  }
  return s;
}

double CostModel::fp8_amax_tp_seconds(const ParallelConfig& c) const {
  if (!fp8_ || model_.training.fp8_recipe != model::Fp8Recipe::kTensorwise || !c.sequence_parallel || c.tp == 1) {
    return 0;
  }
  return 2.0 * all_reduce_seconds(4.0, tp_group(c));
}

}  // namespace dtrain::plan
