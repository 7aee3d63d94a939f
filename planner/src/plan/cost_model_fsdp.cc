// The cost model's terms for fully sharded data parallelism (ParallelConfig::fsdp; docs/cost-model.md#fsdp): each
// data-parallel rank holds 1/dp of the parameters, gradients and optimizer state; a unit's (a transformer layer's, the
// embedding's, the head's) parameters are all-gathered before its forward and again before its backward, and its
// gradients reduce-scattered after its backward, every micro-batch, the next unit's collective running while this one
// computes (PyTorch FSDP2's and Megatron-FSDP's way with one unit of prefetch).
#include <algorithm>

#include "dtrain/model/layout_fit.h"
#include "dtrain/plan/cost_model.h"

namespace dtrain::plan {

double CostModel::sharded_params(const ParallelConfig& c, double params, double expert_params) const {
  // The experts' share is split over the dp / ep ranks holding them: per GPU, ep times the share of the rest.
  return (params - expert_params) / c.dp_cp() + expert_params * c.ep / c.dp_cp();
}

double CostModel::fsdp_whole_params(const ParallelConfig& c, int stage) const {
  const auto& m = model_.model;
  if (!c.fsdp || !model::tied_matrix_apart(m, c.pp, c.fsdp, c.dp_cp())) return 0;
  if (stage != 0 && stage != c.pp - 1) return 0;
  return static_cast<double>(model::vocab_shard_rows(m, c.tp)) * static_cast<double>(m.hidden);
}

std::pair<double, double> CostModel::fsdp_end_units(const ParallelConfig& c, int stage) const {
  const bool first = stage == 0, last = stage == c.pp - 1;
  const double whole = fsdp_whole_params(c, stage);
  return {first ? stage_params(c, 0, 0, true, false) - whole : 0.0,
          last ? stage_params(c, 0, 0, false, true) - (first ? 0.0 : whole) : 0.0};
}

double CostModel::fsdp_unit_params(const ParallelConfig& c, int stage) const {
  const int layers = c.stage_layers(stage);
  const int moe = graph_.moe.empty() ? 0 : stage_moe_layers(c, stage);
  double unit = 0;
  if (layers > moe) unit = layers_params(c, 1, 0);
  if (moe > 0) unit = std::max(unit, layers_params(c, 0, 1));
  const auto [embedding, head] = fsdp_end_units(c, stage);
  return std::max({unit, embedding, head});
}

double CostModel::fsdp_tied_seconds(const ParallelConfig& c) const {
  const double whole = std::max(fsdp_whole_params(c, 0), fsdp_whole_params(c, c.pp - 1));
  if (whole == 0) return 0;
  // The distributed optimizer's pair for one bucket: the gradients reduce-scattered, the updated slices gathered.
  const GroupGeometry g = dp_group(c);
  return reduce_scatter_seconds(whole * grad_bytes_per_param(model_.training), g) +
         all_gather_seconds(whole * weight_bytes_per_param(model_.training.dtype), g);
}

StageTimes CostModel::with_fsdp(const ParallelConfig& c, int stage, StageTimes st) const {
  if (!c.fsdp || c.dp_cp() == 1) return st;
  const auto& t = model_.training;
  const double wb = weight_bytes_per_param(t.dtype), gb = grad_bytes_per_param(t);
  const GroupGeometry dp = dp_group(c);
  const bool first = stage == 0, last = stage == c.pp - 1;
  const int layers = c.stage_layers(stage);
  const int moe = graph_.moe.empty() ? 0 : stage_moe_layers(c, stage);
  // One pass's all-gathers (of the weights, in their training dtype) and the backward's reduce-scatters (of the
  // gradients), unit by unit: dense parameters over dp, a MoE layer's routed experts over the ranks holding them.
  struct Collectives {
    double gather = 0, scatter = 0;
  };
  auto unit = [&](double params, double experts) {
    Collectives u{all_gather_seconds((params - experts) * wb, dp), reduce_scatter_seconds((params - experts) * gb, dp)};
    if (experts > 0 && c.dp_cp() / c.ep > 1) {
      const GroupGeometry edp = edp_group(c);
      u.gather += all_gather_seconds(experts * wb, edp);
      u.scatter += reduce_scatter_seconds(experts * gb, edp);
    }
    return u;
  };
  Collectives all;
  auto add = [&](const Collectives& u, int times) {
    all.gather += u.gather * times;
    all.scatter += u.scatter * times;
  };
  if (layers > moe) add(unit(layers_params(c, 1, 0), 0), layers - moe);
  if (moe > 0) add(unit(layers_params(c, 0, 1), moe_layer_expert_params(c)), moe);
  const auto [embedding, head] = fsdp_end_units(c, stage);
  if (first) add(unit(embedding, 0), 1);
  if (last) add(unit(head, 0), 1);
  const int units = layers + (first ? 1 : 0) + (last ? 1 : 0);
  if (units == 0) return st;
  // Each chunk's first unit is gathered before anything can hide it; the rest while the unit before computes.
  const double lead = all.gather / units * c.vpp;
  const double forward = lead + std::max(0.0, all.gather - lead - st.forward_s);
  const double backward =
      lead + std::max(0.0, all.gather + all.scatter - lead - (st.backward_input_s + st.backward_weight_s));
  st.forward_s += forward;
  st.backward_input_s += backward;
  st.fsdp_comm_s += forward + backward;
  return st;
}

}  // namespace dtrain::plan
