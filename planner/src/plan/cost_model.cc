#include "dtrain/plan/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dtrain/common/error.h"
#include "dtrain/model/layout_fit.h"

namespace dtrain::plan {

using model::Op;
using model::OpKind;
using model::TpSplit;
using model::vocab_shard_rows;

namespace {

// Optimizer state per parameter: mixed-precision Adam keeps an fp32 master copy and two fp32 moments (12 bytes;
// Korthikanti et al. count 18 bytes with the 2-byte weight and 4-byte gradient); pure fp32 training needs no master
// copy. Adam keeps two moments (the only optimizer dtrain trains with).
double optimizer_bytes_per_param(const model::TrainingSpec& t) {
  const double master = t.dtype == DType::kFp32 ? 0.0 : 4.0;
  return master + 8.0;
}

// Saved activation bytes per token of a layer's ops for one micro-batch (full recomputation aside); `selective`
// leaves out the attention scores. `moe_div`: the MoE MLP's share of the tokens (tp with etp = 1, where each rank
// routes its own sequence shard; else 1).
inline double saved_per_token(const std::vector<Op>& ops, double tp, double seq_div, bool selective,
                              double moe_div = 1.0) {
  double bytes = 0;
  for (const Op& op : ops) {
    const double replicated =
        moe_div > 1 && op.is_moe() ? op.saved_replicated_per_token / moe_div : op.saved_replicated_per_token;
    bytes += op.saved_sharded_per_token / tp + op.saved_sequence_per_token / seq_div + replicated;
    if (!selective) bytes += op.saved_quadratic_per_token / tp;
  }
  return bytes;
}

}  // namespace

CostModel::CostModel(model::ModelDescription model, topology::ClusterSpec cluster)
    : model_(std::move(model)),
      cluster_(topology::default_network(std::move(cluster))),
      graph_(model::build_layer_graph(model_.model, model_.training)) {
  if (cluster_.network.subgroup_sync_us > 0 && cluster_.node.ranks_share_cores()) {
    topology::ClusterSpec alone = cluster_;
    alone.network.subgroup_sync_us = 0;
    uncontended_ = std::make_shared<const CostModel>(model_, std::move(alone));
  }
  fp8_ = model_.training.fp8_enabled();
  if (fp8_ && !(cluster_.node.gpu.peak_flops(DType::kFp8) > 0)) {
    throw input_error(fmt::format(
        "{}: the GPU {} of cluster \"{}\" has no FP8 tensor cores ([gpu] tflops_fp8 is 0 or not given): FP8 GEMMs "
        "need Hopper (H100, H200), Ada (L40S) or newer; set fp8 = \"none\", or give the GPU's [gpu] tflops_fp8",
        model_.located("training.fp8", fmt::format("[training] fp8 = \"{}\"", to_string(model_.training.fp8))),
        cluster_.node.gpu.name, cluster_.name));
  }
  // Without a rate for the training dtype every GEMM would take forever and each time would come out NaN.
  if (!(cluster_.node.gpu.peak_flops(model_.training.dtype) > 0)) {
    const std::string dtype(to_string(model_.training.dtype));
    throw input_error(fmt::format(
        "cluster \"{}\": its GPU \"{}\" has no {} rate ([gpu] tflops_{} is 0 or not given); give it in the cluster's "
        "[gpu] table, or train in a dtype the GPU has",
        cluster_.name, cluster_.node.gpu.name, dtype, dtype));
  }
  auto split_params = [&](const std::vector<Op>& ops, double& sharded, double& replicated) {
    for (const Op& op : ops) {
      double p = static_cast<double>(op.params);
      if (op.experts > 0) {
        moe_expert_params_ += p;
      } else if (op.moe == model::MoePart::kSharedExperts) {
        moe_shared_params_ += p;
      } else if (op.split == TpSplit::kSequence || op.split == TpSplit::kReplicated) {
        replicated += p;
      } else if (op.kind == OpKind::kLinear && op.split == TpSplit::kRow) {
        double bias =
            static_cast<double>(op.params - std::max<std::int64_t>(op.experts, 1) * op.in_features * op.out_features);
        sharded += p - bias;
        replicated += bias;
      } else {
        sharded += p;
      }
    }
  };
  split_params(graph_.layer, layer_params_sharded_, layer_params_replicated_);
  split_params(graph_.moe_layer, moe_params_sharded_, moe_params_replicated_);
}

std::optional<std::string> CostModel::structural_problem(const ParallelConfig& c, std::int64_t global_batch) const {
  const auto& m = model_.model;
  if (c.tp < 1 || c.pp < 1 || c.dp < 1 || c.vpp < 1 || c.micro_batch < 1 || c.cp < 1) {
    return "every degree must be at least 1";
  }
  if (auto problem = model::layout_fit_problem(m, c.shard_degrees())) return problem;
  if (auto problem = cp_problem(m, c)) return problem;
  if (m.moe.enabled() && c.dp_cp() % c.ep != 0) {
    return c.cp > 1 ? fmt::format(
                          "ep={} does not divide dp*cp={} (experts are split over the data- and "
                          "context-parallel ranks)",
                          c.ep, c.dp_cp())
                    : fmt::format("ep={} does not divide dp={} (experts are split over data parallelism)", c.ep, c.dp);
  }
  int g = cluster_.node.gpus;
  if (c.tp < g ? g % c.tp != 0 : c.tp % g != 0) {
    return fmt::format("tp={} groups would straddle nodes of {} GPUs", c.tp, g);
  }
  if (c.pp > m.layers) return fmt::format("pp={} exceeds layers={}", c.pp, m.layers);
  if (!c.chunk_layers.empty()) {
    if (static_cast<int>(c.chunk_layers.size()) != c.pp * c.vpp) {
      return fmt::format("chunk_layers has {} entries, pp*vpp = {}", c.chunk_layers.size(), c.pp * c.vpp);
    }
    int sum = 0;
    for (int l : c.chunk_layers) {
      if (l < 1) return "every model chunk needs at least one layer";
      sum += l;
    }
    if (sum != m.layers) return fmt::format("chunk_layers add up to {}, the model has {} layers", sum, m.layers);
  } else if (static_cast<std::int64_t>(c.pp) * c.vpp > m.layers) {
    return fmt::format("pp*vpp={} exceeds layers={}", c.pp * c.vpp, m.layers);
  }
  if (global_batch % (static_cast<std::int64_t>(c.micro_batch) * c.dp) != 0) {
    return fmt::format("global_batch={} is not a multiple of micro_batch*dp={}", global_batch, c.micro_batch * c.dp);
  }
  std::int64_t mbs = global_batch / (static_cast<std::int64_t>(c.micro_batch) * c.dp);
  if (c.schedule == Schedule::kInterleaved) {
    if (c.vpp < 2) return "the interleaved schedule needs vpp >= 2";
    if (c.pp < 2) return "the interleaved schedule needs pp >= 2";
    if (mbs % c.pp != 0) return fmt::format("interleaving needs num_microbatches={} divisible by pp={}", mbs, c.pp);
  } else if (c.vpp != 1) {
    return fmt::format("vpp={} needs the interleaved schedule", c.vpp);
  }
  if (c.distributed_optimizer && c.dp_cp() == 1) return "the distributed optimizer needs dp*cp > 1";
  if (c.fsdp && !c.distributed_optimizer) {
    return "fsdp needs the distributed optimizer (it shards the optimizer state as the parameters)";
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------------
// Compute

double CostModel::gemm_seconds(double m, double n, double k) const {
  const auto& gpu = cluster_.node.gpu;
  const auto& cal = gpu.calibration;
  double flops = 2.0 * m * n * k;
  // Efficiency rises with the GEMM's size and saturates (Calculon's step function, made smooth): small GEMMs lose to
  // launch overhead and partial waves of thread blocks.
  double eff = cal.gemm_efficiency_max * flops / (flops + cal.gemm_half_gflop * 1e9);
  double peak = gpu.peak_flops(model_.training.dtype);
  double compute = flops / (peak * eff);
  double bytes = static_cast<double>(gemm_operand_bytes(model_.training.dtype)) * (m * k + k * n + m * n);
  return std::max(compute, memory_seconds(bytes));
}

double CostModel::memory_seconds(double bytes) const {
  const auto& gpu = cluster_.node.gpu;
  return bytes / (gpu.hbm_gbps * 1e9 * gpu.calibration.hbm_efficiency);
}

namespace {
struct Partition {
  double tokens;        // tokens of the micro-batch
  double local_tokens;  // tokens this rank's sequence-split ops see
  double tp;
};
Partition partition(const ParallelConfig& c, double seq_len) {
  double tokens = static_cast<double>(c.micro_batch) * seq_len / c.cp;
  return {tokens, c.sequence_parallel ? tokens / c.tp : tokens, static_cast<double>(c.tp)};
}
}  // namespace

double CostModel::op_forward_seconds(const Op& op, const ParallelConfig& c) const {
  const auto& m = model_.model;
  Partition p = partition(c, static_cast<double>(m.seq_len));
  // etp = 1: the MoE MLP's ops see this rank's sequence shard, with whole experts.
  if (moe_token_parallel(c) && op.is_moe()) p = {p.tokens / p.tp, p.tokens / p.tp, 1.0};
  switch (op.kind) {
    case OpKind::kLinear: {
      // With FP8 the input is cast first (fp8_cast_seconds).
      const LinearGemm g = linear_gemm(op, c);
      return g.seconds(*this) + (g.fp8 ? g.groups * fp8_cast_seconds(g.rows * g.in) : 0.0);
    }
    case OpKind::kAttention: {
      double s = static_cast<double>(m.seq_len), hd = static_cast<double>(m.head_dim());
      double heads = static_cast<double>(m.heads) / p.tp;
      double batch = static_cast<double>(c.micro_batch) * heads;
      if (op.causal_fraction < 1.0) return flash_attention_seconds(op, c, false);
      double elementwise = memory_seconds(op.bytes_per_token * p.tokens / p.tp);
      // QK^T (s/cp x hd by hd x s) and AV (s/cp x s by s x hd), batched over micro-batch and local heads: the rank's
      // queries against the whole sequence's keys.
      double scores = gemm_seconds(batch * s / c.cp, s, hd);
      double values = gemm_seconds(batch * s / c.cp, hd, s);
      return scores + values + elementwise;
    }
    case OpKind::kTokenEmbedding:
      // Every rank of a vocab-parallel embedding looks up all tokens (zeros outside its vocabulary shard).
      return memory_seconds(op.bytes_per_token * p.tokens);
    case OpKind::kNorm:
    case OpKind::kDropoutResidual:
      return memory_seconds(op.bytes_per_token * p.local_tokens);
    case OpKind::kRope:
    case OpKind::kActivation:
    case OpKind::kCrossEntropy:
      return memory_seconds(op.bytes_per_token * p.tokens / p.tp);
    case OpKind::kPermute:
      return memory_seconds(op.bytes_per_token * p.tokens);
  }
  return 0;
}

CostModel::LinearGemm CostModel::linear_gemm(const Op& op, const ParallelConfig& c) const {
  const auto& m = model_.model;
  Partition p = partition(c, static_cast<double>(m.seq_len));
  // etp = 1: the MoE MLP's ops see this rank's sequence shard, with whole experts.
  if (moe_token_parallel(c) && op.is_moe()) p = {p.tokens / p.tp, p.tokens / p.tp, 1.0};
  const double in = static_cast<double>(op.in_features), out = static_cast<double>(op.out_features);
  LinearGemm g;
  g.fp8 = fp8_gemm(op);
  if (op.experts > 0) {
    // One GEMM per local expert (experts / ep of them) on its share of the routed rows: the rank's tokens times
    // top_k spread evenly over the experts, times the load imbalance of the busiest rank (ep > 1).
    const double experts = static_cast<double>(op.experts) / c.ep;
    const double imbalance = c.ep > 1 ? cluster_.calibration().moe_imbalance : 1.0;
    g.rows = p.tokens * static_cast<double>(op.top_k) / experts * imbalance;
    g.groups = experts / cluster_.calibration().expert_gemm_efficiency;  // one grouped call
  } else {
    g.rows = p.tokens;
  }
  g.in = in;
  g.out = out;
  if (op.split == TpSplit::kRow) {
    g.in = in / p.tp;
  } else if (op.split == TpSplit::kVocab) {
    g.out = static_cast<double>(vocab_shard_rows(m, c.tp));  // the logits: the rank's rows of the padded vocabulary
  } else if (op.split != TpSplit::kReplicated) {
    g.out = std::ceil(out / p.tp);  // column-parallel
  }
  return g;
}

double CostModel::flash_attention_seconds(const Op& op, const ParallelConfig& c, bool backward) const {
  // Fused flash kernel: compute-bound at the attention kernel's efficiency (by sequence length and pass where dtplan
  // calibrate measured it), or bound by its bytes where those take longer. The rank's heads see all its tokens.
  const auto& gpu = cluster_.node.gpu;
  const double seq_len = static_cast<double>(model_.model.seq_len);
  const Partition p = partition(c, seq_len);
  const double tokens = p.tokens / p.tp;
  const double flops = op.flops_per_token * tokens * op.causal_fraction;
  // With context parallelism the kernel runs on the rank's chunks (seq_len / cp query rows against up to all keys).
  const double efficiency = gpu.calibration.attention_efficiency_at(seq_len / c.cp, backward);
  return std::max(flops / (gpu.peak_flops(model_.training.dtype) * efficiency),
                  memory_seconds(op.bytes_per_token * tokens));
}

double CostModel::op_backward_seconds(const Op& op, const ParallelConfig& c) const {
  return backward_seconds(op, c, op_forward_seconds(op, c));
}

double CostModel::backward_seconds(const Op& op, const ParallelConfig& c, double forward_s) const {
  // A flash kernel's backward at the backward pass's own efficiency: backward_factor times the forward's FLOPs and
  // bytes. Every other op's is backward_factor times its forward.
  if (op.kind == OpKind::kAttention && op.causal_fraction < 1.0) {
    return op.backward_factor * flash_attention_seconds(op, c, true);
  }
  // FP8: the GEMMs backward_factor times, and the output gradient's cast (the input's was the forward's).
  if (fp8_gemm(op)) {
    const LinearGemm g = linear_gemm(op, c);
    return op.backward_factor * g.seconds(*this) + g.groups * fp8_cast_seconds(g.rows * g.out);
  }
  return op.backward_factor * forward_s;
}

double CostModel::op_weight_grad_seconds(const Op& op, const ParallelConfig& c) const {
  // A linear layer's backward is two GEMMs of its forward's size: input gradient and weight gradient.
  if (op.kind != OpKind::kLinear || op.params == 0) return 0;
  return linear_gemm(op, c).seconds(*this);
}

// ---------------------------------------------------------------------------------------------------------------
// Communication

GroupGeometry CostModel::tp_group(const ParallelConfig& c) const {
  int g = cluster_.node.gpus;
  GroupGeometry geo;
  geo.size = c.tp;
  geo.per_node = std::min(c.tp, g);
  geo.nodes = (c.tp + geo.per_node - 1) / geo.per_node;
  geo.nvlink = geo.per_node <= cluster_.node.nvlink_domain;
  return geo;
}

// `size` data-parallel ranks `step` apart: the data-parallel group (size dp), an expert group (size ep) or an
// expert data-parallel group (size dp / ep, step ep).
GroupGeometry CostModel::data_parallel_ranks(const ParallelConfig& c, int size, int step) const {
  int g = cluster_.node.gpus;
  int stride = (c.placement == PlacementOrder::kTpDpPp ? c.tp : c.tp * c.pp) * step;
  GroupGeometry geo;
  geo.size = size;
  geo.per_node = stride < g ? std::max(1, std::min(size, g / stride)) : 1;
  geo.nodes = (size + geo.per_node - 1) / geo.per_node;
  // Members on one node are `stride` GPUs apart: inside one NVLink domain when they fit in it.
  geo.nvlink = (geo.per_node - 1) * stride < cluster_.node.nvlink_domain;
  return geo;
}

GroupGeometry CostModel::dp_group(const ParallelConfig& c) const { return data_parallel_ranks(c, c.dp_cp()); }

GroupGeometry CostModel::ep_group(const ParallelConfig& c) const { return data_parallel_ranks(c, c.ep); }

GroupGeometry CostModel::edp_group(const ParallelConfig& c) const {
  return data_parallel_ranks(c, c.dp_cp() / c.ep, c.ep);
}

double CostModel::all_to_all_seconds(double bytes, const GroupGeometry& g) const {
  // Each member keeps 1/size of its bytes and sends the rest, (per_node - 1)/size of them to members on its node
  // (NVLink or PCIe) and (size - per_node)/size over the network at its share of the node's NICs, both at once;
  // pairwise exchanges, one latency per peer.
  if (g.size <= 1 || bytes <= 0) return 0;
  const auto& node = cluster_.node;
  const auto& net = cluster_.network;
  const double n = g.size;
  double local = 0, remote = 0;
  if (g.per_node > 1) {
    const double part = bytes * (g.per_node - 1) / n;
    local = net.nvlink_latency_s() * (g.per_node - 1) + part / ((g.nvlink ? node.nvlink_gbps : node.pcie_gbps) * 1e9 *
                                                                net.efficiency_at("nvlink", g.per_node, part));
  }
  if (g.nodes > 1) {
    const double part = bytes * (n - g.per_node) / n;
    remote = net.network_latency_s() * (n - g.per_node) +
             part / (node.network_gbps_per_gpu() * 1e9 * net.efficiency_at("network", g.nodes, part));
  }
  return std::max(local, remote);
}

bool CostModel::pp_neighbours_share_node(const ParallelConfig& c) const {
  int stride = c.placement == PlacementOrder::kTpDpPp ? c.tp * c.dp_cp() : c.tp * c.cp;
  return static_cast<std::int64_t>(stride) * c.pp <= cluster_.node.gpus;
}

double CostModel::collective_seconds(double bytes, const GroupGeometry& g, double bw_factor, int steps_factor) const {
  // Ring algorithm, hierarchical when the group spans nodes: inside the node over NVLink (or PCIe), then across
  // nodes on 1/per_node of the data, each GPU using its share of the node's NICs (every GPU of the node is in some
  // group of this kind and they communicate at once). Time per level: latency per ring step + the algorithm's
  // bandwidth factor ((n-1)/n per pass; all-reduce makes two passes) x bytes / (bandwidth x efficiency(bytes)).
  if (g.size <= 1 || bytes <= 0) return 0;
  const auto& node = cluster_.node;
  const auto& net = cluster_.network;
  double t = 0;
  int k = g.per_node;
  if (k > 1) {
    double bw = (g.nvlink ? node.nvlink_gbps : node.pcie_gbps) * 1e9;
    double eff = net.efficiency_at("nvlink", k, bytes);
    if (k < node.gpus) t += net.subgroup_sync_s();
    t += net.collective_sync_s() + net.nvlink_latency_s() * steps_factor * (k - 1) +
         bw_factor * (k - 1) / k * bytes / (bw * eff);
  }
  int n = g.nodes;
  if (n > 1) {
    double shard = bytes / k;
    double bw = node.network_gbps_per_gpu() * 1e9;
    double eff = net.efficiency_at("network", n, shard);
    t += net.network_latency_s() * steps_factor * (n - 1) + bw_factor * (n - 1) / n * shard / (bw * eff);
  }
  return t;
}

double CostModel::all_reduce_seconds(double bytes, const GroupGeometry& g) const {
  return collective_seconds(bytes, g, 2.0, 2);
}
double CostModel::all_gather_seconds(double bytes, const GroupGeometry& g) const {
  return collective_seconds(bytes, g, 1.0, 1);
}
double CostModel::reduce_scatter_seconds(double bytes, const GroupGeometry& g) const {
  return collective_seconds(bytes, g, 1.0, 1);
}

double CostModel::hidden_bytes(const ParallelConfig& c) const {
  return local_tokens(c) * static_cast<double>(model_.model.hidden) * activation_bytes(model_.training.dtype);
}

double CostModel::layer_tp_forward_seconds(const ParallelConfig& c) const {
  if (c.tp == 1) return 0;
  GroupGeometry g = tp_group(c);
  double bytes = hidden_bytes(c);
  // Megatron's split: one all-reduce after each row-parallel layer (attention output, fc2); with sequence
  // parallelism an all-gather before each column-parallel layer and a reduce-scatter after each row-parallel one.
  // With FP8 GEMMs the all-gathered inputs travel in FP8 (Transformer Engine casts before it gathers).
  if (c.sequence_parallel) {
    const double gathered = fp8_ ? bytes / activation_bytes(model_.training.dtype) : bytes;
    return 2.0 * (all_gather_seconds(gathered, g) + reduce_scatter_seconds(bytes, g)) + fp8_amax_tp_seconds(c);
  }
  return 2.0 * all_reduce_seconds(bytes, g);
}

double CostModel::layer_tp_backward_seconds(const ParallelConfig& c) const {
  // Backward mirrors forward: all-reduce of the column-parallel layers' input gradients (reduce-scatter, plus the
  // all-gather of the output gradient before each row-parallel layer, with sequence parallelism).
  return layer_tp_forward_seconds(c);
}

double CostModel::regather_seconds(const std::vector<Op>& ops, const ParallelConfig& c) const {
  if (!c.sequence_parallel || c.tp == 1) return 0;
  // With sequence parallelism a column-parallel layer keeps only its input's sequence shard; its weight gradient
  // all-gathers the shard again (ir/lower.cc), after the input gradient's GEMM (in BWD_W with zero-bubble).
  // dtrain's executor runs it in stream order with the passes, so it is not hidden behind a GEMM.
  int column = 0;
  for (const Op& op : ops) column += op.split == model::TpSplit::kColumn && !op.is_moe() ? 1 : 0;
  return column * all_gather_seconds(hidden_bytes(c), tp_group(c));
}

double CostModel::p2p_seconds(const ParallelConfig& c) const {
  if (c.pp == 1) return 0;
  const auto& node = cluster_.node;
  const auto& net = cluster_.network;
  double bytes = hidden_bytes(c);
  // Each tensor-parallel rank sends its 1/tp slice (already sharded with sequence parallelism; otherwise Megatron's
  // scatter-gather optimisation splits it and the receiver all-gathers over NVLink).
  double shard = bytes / c.tp;
  bool local = pp_neighbours_share_node(c);
  double bw = (local ? node.nvlink_gbps : node.network_gbps_per_gpu()) * 1e9;
  double eff = net.efficiency_at(local ? "nvlink" : "network", 2, shard);
  double t = net.p2p_latency_s() + shard / (bw * eff);
  // CPU ranks sharing fewer cores: each further whole pipeline on the node makes a transfer's partner more often off
  // its core (running that pipeline's pass) when the data arrives.
  if (net.p2p_pipelines_us > 0 && node.ranks_share_cores()) {
    const int pipelines = node.gpus / (c.tp * c.pp);
    if (pipelines > 1) t += (pipelines - 1) * net.p2p_pipelines_s();
  }
  if (!c.sequence_parallel && c.tp > 1) t += all_gather_seconds(bytes, tp_group(c));
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// Stage times

namespace {
StageTimes& operator+=(StageTimes& a, const StageTimes& b) {
  a.forward_s += b.forward_s;
  a.backward_input_s += b.backward_input_s;
  a.backward_weight_s += b.backward_weight_s;
  a.recompute_s += b.recompute_s;
  a.tp_comm_s += b.tp_comm_s;
  a.ep_comm_s += b.ep_comm_s;
  a.fsdp_comm_s += b.fsdp_comm_s;
  a.cp_comm_s += b.cp_comm_s;
  return a;
}
StageTimes scaled(const StageTimes& a, double n) {
  return {a.forward_s * n, a.backward_input_s * n, a.backward_weight_s * n, a.recompute_s * n,
          a.tp_comm_s * n, a.ep_comm_s * n,        a.fsdp_comm_s * n,       a.cp_comm_s * n};
}
}  // namespace

StageTimes CostModel::ops_times(const std::vector<Op>& ops, const ParallelConfig& c) const {
  // The host issues the ops one after the other, each `h` seconds after the one before (the first as the pass begins:
  // in a long run of device-bound layers the host is ahead); the device runs each as soon as it is issued and the one
  // before it is done. So op i (from 0) ends at T_i = max(T_{i-1}, i h) + d_i. With no host cost a pass is the sum of
  // its ops; with a large one (a small model on a GPU) about the ops' count times it. The backward pass runs the ops
  // last to first: it ends at max over m of ((n - 1 - m) h + the device time of ops 0..m), tracked in the same loop.
  // (One pass, no buffers: the search prices every candidate through here.)
  const auto& cal = cluster_.calibration();
  const double hf = cal.host_op_forward_us * 1e-6, hb = cal.host_op_backward_us * 1e-6;
  StageTimes t;
  double backward_prefix = 0, backward_latest = 0;  // the device time of ops 0..m; the largest prefix - m hb
  int recomputed = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    double f = op_forward_seconds(op, c);
    double w = op_weight_grad_seconds(op, c);
    const double b = backward_seconds(op, c, f);
    t.forward_s = std::max(t.forward_s, static_cast<double>(i) * hf) + f;
    t.backward_input_s += b - w;
    t.backward_weight_s += w;
    backward_prefix += b;
    backward_latest = std::max(backward_latest, backward_prefix - static_cast<double>(i) * hb);
    if (c.recompute == Recompute::kSelective && op.kind == OpKind::kAttention) {
      t.recompute_s = std::max(t.recompute_s, static_cast<double>(recomputed++) * hf) + f;
    }
  }
  if (hb > 0 && !ops.empty()) {
    const double device = t.backward_input_s + t.backward_weight_s;
    const double pass = static_cast<double>(ops.size() - 1) * hb + backward_latest;
    if (pass > device) {
      const double scale = device > 0 ? pass / device : 0.0;  // the split between the two parts stays
      t.backward_input_s = device > 0 ? t.backward_input_s * scale : pass;
      t.backward_weight_s *= scale;
    }
  }
  return t;
}

StageTimes CostModel::layer_times(const std::vector<Op>& ops, const ParallelConfig& c) const {
  StageTimes layer = ops_times(ops, c);
  double tp_f = layer_tp_forward_seconds(c);
  double tp_b = layer_tp_backward_seconds(c);
  double ep_f = 0, cp_f = 0, cp_b = 0;
  if (c.cp > 1) {
    for (const Op& op : ops) {
      if (op.kind != OpKind::kAttention) continue;
      const double f = op_forward_seconds(op, c);
      cp_f += cp_forward_seconds(c, f);
      cp_b += cp_backward_seconds(c, backward_seconds(op, c, f));
    }
  }
  if (&ops == &graph_.moe_layer) {
    double tokens = local_tokens(c);
    const double k = static_cast<double>(model_.model.moe.top_k);
    if (moe_token_parallel(c)) {
      // etp = 1: the MLP's gather and reduce-scatter (half of the layer's) are gone; each rank routes its shard.
      tp_f /= 2;
      tp_b /= 2;
      tokens /= c.tp;
    } else if (c.tp > 1) {
      // The gates' gradients are partial sums over the experts' shards: one all-reduce of top_k fp32 per token.
      tp_b += all_reduce_seconds(4.0 * tokens * k, tp_group(c));
    }
    // Expert parallelism: the routed rows go to their experts' ranks and back (dispatch and combine), in the
    // forward and again in the backward, each after an all-to-all of the rows' counts; with imbalance the busiest
    // rank receives more.
    if (c.ep > 1) {
      const GroupGeometry g = ep_group(c);
      const double rows = tokens * k * cluster_.calibration().moe_imbalance;
      const double bytes = rows * static_cast<double>(model_.model.hidden) * activation_bytes(model_.training.dtype);
      ep_f = 2.0 * (all_to_all_seconds(bytes, g) + all_to_all_seconds(4.0 * c.ep * c.ep, g));
    }
  }
  if (c.recompute == Recompute::kFull) layer.recompute_s = layer.forward_s + tp_f + ep_f + cp_f;
  const double regather = regather_seconds(ops, c);
  layer.forward_s += tp_f + ep_f + cp_f;
  layer.backward_input_s += tp_b + ep_f + cp_b + layer.recompute_s;
  layer.cp_comm_s = cp_f + cp_b + (c.recompute == Recompute::kFull ? cp_f : 0.0);
  layer.backward_weight_s += regather;
  layer.tp_comm_s = tp_f + tp_b + regather + (c.recompute == Recompute::kFull ? tp_f : 0.0);
  layer.ep_comm_s = 2.0 * ep_f + (c.recompute == Recompute::kFull ? ep_f : 0.0);
  return layer;
}

LayerCosts CostModel::layer_costs(const ParallelConfig& c) const {
  LayerCosts lc;
  lc.layer = layer_times(graph_.layer, c);
  if (!graph_.moe_layer.empty()) {
    lc.moe_layer = layer_times(graph_.moe_layer, c);
    lc.moe = &graph_.moe;
  }

  lc.embedding = ops_times(graph_.embedding, c);
  lc.head = ops_times(graph_.head, c);
  if (c.tp > 1) {
    GroupGeometry g = tp_group(c);
    double hb = hidden_bytes(c);
    // The vocab-parallel lookup's partial rows are summed: all-reduce (reduce-scatter with SP).
    double emb = c.sequence_parallel ? reduce_scatter_seconds(hb, g) : all_reduce_seconds(hb, g);
    lc.embedding.forward_s += emb;
    lc.embedding.tp_comm_s += emb;
    // Input of the vocab-parallel logits: all-gathered with SP; its gradient all-reduced (reduce-scattered).
    // Cross entropy: three all-reduces of one fp32 value per token (max, target logit, sum of exponentials).
    double ce = 3.0 * all_reduce_seconds(4.0 * local_tokens(c), g);
    double fwd = (c.sequence_parallel ? all_gather_seconds(hb, g) : 0.0) + ce;
    double bwd = c.sequence_parallel ? reduce_scatter_seconds(hb, g) : all_reduce_seconds(hb, g);
    const double regather = regather_seconds(graph_.head, c);
    lc.head.forward_s += fwd;
    lc.head.backward_input_s += bwd;
    lc.head.backward_weight_s += regather;
    lc.head.tp_comm_s += fwd + bwd + regather;
    // With SP the lookup's reduce-scatter has an all-gather of the gradient for its backward.
    if (c.sequence_parallel) {
      const double emb_b = all_gather_seconds(hb, g);
      lc.embedding.backward_input_s += emb_b;
      lc.embedding.tp_comm_s += emb_b;
    }
  }
  return lc;
}

StageTimes CostModel::chunk_times(const LayerCosts& lc, int first_layer, int layers, bool embedding, bool head) {
  int moe = 0;
  if (lc.moe != nullptr) {
    for (int l = first_layer; l < first_layer + layers; ++l) moe += &lc.at(l) == &lc.moe_layer ? 1 : 0;
  }
  // (A chunk holds few layers; the search calls this once per chunk and candidate.)
  StageTimes out = scaled(lc.layer, static_cast<double>(layers - moe));
  if (moe > 0) out += scaled(lc.moe_layer, static_cast<double>(moe));
  if (embedding) out += lc.embedding;
  if (head) out += lc.head;
  return out;
}

StageTimes CostModel::chunk_times(const ParallelConfig& c, int first_layer, int layers, bool embedding,
                                  bool head) const {
  return chunk_times(layer_costs(c), first_layer, layers, embedding, head);
}

// ---------------------------------------------------------------------------------------------------------------
// Data parallelism and optimizer

int CostModel::stage_moe_layers(const ParallelConfig& c, int stage) const {
  int moe = 0;
  for (int v = 0, first = 0, ch = 0; v < c.vpp; ++v) {
    // first: the first layer of chunk ch, walked up to chunk v * pp + stage.
    for (; ch < v * c.pp + stage; ++ch) first += c.chunk_layers[static_cast<std::size_t>(ch)];
    moe += graph_.moe_layers_in(first, c.chunk_layers[static_cast<std::size_t>(ch)]);
  }
  return moe;
}

double CostModel::layer_params(const ParallelConfig& c, int layer) const {
  return graph_.is_moe(layer) ? layers_params(c, 0, 1) : layers_params(c, 1, 0);
}

double CostModel::expert_layer_params(const ParallelConfig& c, int layer) const {
  return graph_.is_moe(layer) ? moe_layer_expert_params(c) : 0.0;
}

double CostModel::stage_expert_params(const ParallelConfig& c, int stage) const {
  return graph_.moe.empty() ? 0.0 : stage_moe_layers(c, stage) * moe_layer_expert_params(c);
}

double CostModel::expert_params(const ParallelConfig& c, int first_layer, int layers) const {
  if (graph_.moe.empty()) return 0;
  return graph_.moe_layers_in(first_layer, layers) * moe_layer_expert_params(c);
}

double CostModel::stage_params(const ParallelConfig& c, int stage) const {
  // A dense model's layers are all alike: only their number matters.
  if (graph_.moe.empty()) return stage_params(c, 0, c.stage_layers(stage), stage == 0, stage == c.pp - 1);
  const int moe = stage_moe_layers(c, stage);
  return stage_params(c, 0, 0, stage == 0, stage == c.pp - 1) + layers_params(c, c.stage_layers(stage) - moe, moe);
}

double CostModel::stage_params(const ParallelConfig& c, int first_layer, int layers, bool embedding, bool head) const {
  const auto& m = model_.model;
  const int moe = graph_.moe_layers_in(first_layer, layers);
  double p = layers_params(c, layers - moe, moe);
  double vocab_shard = static_cast<double>(vocab_shard_rows(m, c.tp)) * static_cast<double>(m.hidden);
  if (embedding) {
    p += vocab_shard;
    if (m.position == model::PositionKind::kLearned) p += static_cast<double>(m.seq_len * m.hidden);
  }
  if (head) {
    p += m.norm == model::NormKind::kLayerNorm ? 2.0 * m.hidden : static_cast<double>(m.hidden);
    // Untied: the output matrix. Tied with pp > 1: the last stage keeps its own copy of the word embeddings, kept
    // equal by an all-reduce of their gradients with the first stage.
    if (!m.tied_embeddings || (!embedding && c.pp > 1)) p += vocab_shard;
  }
  return p;
}

double CostModel::dp_reduce_seconds(const ParallelConfig& c, double params, double expert_params) const {
  if (c.dp_cp() == 1) return 0;
  if (c.fsdp) return fsdp_tied_seconds(c);  // the passes reduce the units (with_fsdp); the schedule the tied matrix
  if (c.ep <= 1 || expert_params <= 0) return bucket_reduce_seconds(c, params, dp_group(c));
  // The routed experts' gradients are summed over the ranks with the same experts, the rest over dp; one after the
  // other on the same links.
  const double experts = c.dp_cp() / c.ep > 1 ? bucket_reduce_seconds(c, expert_params, edp_group(c)) : 0.0;
  return bucket_reduce_seconds(c, params - expert_params, dp_group(c)) + experts;
}

double CostModel::bucket_reduce_seconds(const ParallelConfig& c, double params, const GroupGeometry& g) const {
  // Fully sharded: every micro-batch's passes gather the parameters and reduce-scatter the gradients (with_fsdp).
  if (c.fsdp) return 0;
  double grad_bytes = params * grad_bytes_per_param(model_.training);
  // Gradients travel in buckets (latency paid per bucket, efficiency of the bucket's size).
  double buckets = std::max(1.0, std::ceil(grad_bytes / kBucketBytes));
  double per_bucket = grad_bytes / buckets;
  if (!c.distributed_optimizer) return buckets * all_reduce_seconds(per_bucket, g);
  // Distributed optimizer (ZeRO-1): reduce-scatter the gradients, all-gather the updated parameters.
  double param_bytes = params * weight_bytes_per_param(model_.training.dtype);
  double param_buckets = std::max(1.0, std::ceil(param_bytes / kBucketBytes));
  return buckets * reduce_scatter_seconds(per_bucket, g) +
         param_buckets * all_gather_seconds(param_bytes / param_buckets, g);
}

double CostModel::optimizer_state_params(const ParallelConfig& c, double params, double expert_params) const {
  return c.distributed_optimizer ? sharded_params(c, params, expert_params) : params;
}

double CostModel::optimizer_seconds(const ParallelConfig& c, double params, double expert_params) const {
  const auto& t = model_.training;
  double local = optimizer_state_params(c, params, expert_params);
  // Adam reads the gradient and the three fp32 states and writes the states and the low-precision weight; the
  // gradient norm reads the gradient once more. A memory-bound pass.
  double state = optimizer_bytes_per_param(t);
  double bytes = grad_bytes_per_param(t) * 2.0 + 2.0 * state + weight_bytes_per_param(t.dtype);
  const auto& gpu = cluster_.node.gpu;
  const double eff = gpu.calibration.optimizer_hbm_efficiency > 0 ? gpu.calibration.optimizer_hbm_efficiency
                                                                  : gpu.calibration.hbm_efficiency;
  return local * bytes / (gpu.hbm_gbps * 1e9 * eff);
}

// ---------------------------------------------------------------------------------------------------------------
// Memory

StageMemory CostModel::stage_memory(const ParallelConfig& c, int stage) const {
  const auto& m = model_.model;
  const auto& t = model_.training;
  const auto& cal = cluster_.calibration();
  StageMemory mem;
  mem.stage = stage;
  mem.layers = c.stage_layers(stage);
  bool first = stage == 0;
  bool last = stage == c.pp - 1;
  mem.params = graph_.moe.empty() ? stage_params(c, 0, mem.layers, first, last) : stage_params(c, stage);
  // The stage's layers, and of them the MoE layers (whose activations and parameters differ).
  const int moe_layers = graph_.moe.empty() ? 0 : stage_moe_layers(c, stage);
  const int dense_layers = mem.layers - moe_layers;
  mem.layer_params = layers_params(c, dense_layers, moe_layers);

  double wb = weight_bytes_per_param(t.dtype);
  double gb = grad_bytes_per_param(t);
  double ob = optimizer_bytes_per_param(t);
  // The routed experts' share (their optimizer state is sharded over edp, not dp).
  const double stage_experts = moe_layers * moe_layer_expert_params(c);
  mem.optimizer_bytes = optimizer_state_params(c, mem.params, stage_experts) * ob;
  if (c.fsdp) {
    // Fully sharded: this rank's shard of the weights and gradients, and whole the unit in use and the one being
    // gathered (in the backward: the one whose gradients are being reduce-scattered); FP8 copies of those two only.
    // Tied word embeddings are held whole beside the shards (fsdp_whole_params), as the distributed optimizer holds
    // its buckets; their optimizer state is sharded.
    const double whole = fsdp_whole_params(c, stage);
    const double held = sharded_params(c, mem.params - whole, stage_experts) + whole;
    const double gathered = 2.0 * fsdp_unit_params(c, stage);
    const double fp8 = mem.layers > 0 ? fp8_weight_params(c, stage) / mem.layers : 0.0;
    mem.weights_bytes = (held + gathered) * wb + 2.0 * std::min(2.0, static_cast<double>(mem.layers)) * fp8;
    mem.gradients_bytes = (held + gathered) * gb;
    mem.layer_state_bytes = sharded_params(c, mem.layer_params, stage_experts) * (wb + gb + ob);
  } else {
    // With FP8 GEMMs the layers' weights are held in FP8 too, row-wise and transposed (Transformer Engine's FP8
    // weight copies, made once per step), beside the bf16 ones.
    mem.weights_bytes = mem.params * wb + 2.0 * fp8_weight_params(c, stage);
    mem.gradients_bytes = mem.params * gb;
    mem.layer_state_bytes =
        mem.layer_params * (wb + gb) + optimizer_state_params(c, mem.layer_params, stage_experts) * ob;
  }

  // Saved activations of one layer for one micro-batch (Korthikanti et al. 2022, Table 2, generalised by op).
  double tokens = local_tokens(c);
  double tp = c.tp;
  double seq_div = c.sequence_parallel ? tp : 1.0;
  // A stage's layers as their mean (dense and MoE layers differ; the peak is reached with all of them held).
  const double dense_share = mem.layers > 0 ? static_cast<double>(dense_layers) / mem.layers : 1.0;
  const double moe_share = 1.0 - dense_share;
  const bool selective = c.recompute == Recompute::kSelective;
  const double dense_full = dense_share > 0 ? saved_per_token(graph_.layer, tp, seq_div, false) : 0;
  const double moe_div = moe_token_parallel(c) ? tp : 1.0;
  const double moe_full = moe_share > 0 ? saved_per_token(graph_.moe_layer, tp, seq_div, false, moe_div) : 0;
  // The largest layer, recomputed in full.
  double full_layer = std::max(dense_full, moe_full) * tokens;
  double layer_bytes = (dense_share * dense_full + moe_share * moe_full) * tokens;
  if (selective) {
    layer_bytes = (dense_share > 0 ? dense_share * saved_per_token(graph_.layer, tp, seq_div, true) : 0) +
                  (moe_share > 0 ? moe_share * saved_per_token(graph_.moe_layer, tp, seq_div, true, moe_div) : 0);
    layer_bytes *= tokens;
  } else if (c.recompute == Recompute::kFull) {
    layer_bytes = tokens * static_cast<double>(m.hidden) * activation_bytes(t.dtype) / seq_div;  // the layer input
  }

  // Micro-batches in flight at the peak, in units of one model chunk's activations.
  double chunk_units = 1;
  int p = c.pp, v = c.vpp, mbs = c.num_microbatches;
  switch (c.schedule) {
    case Schedule::kGpipe:
      chunk_units = static_cast<double>(mbs) * v;
      break;
    case Schedule::k1F1B:
    case Schedule::kZbH1:
      chunk_units = std::min(p - stage, mbs);
      break;
    case Schedule::kInterleaved:
      // Megatron's interleaved warm-up: (p - stage - 1) * 2 + (v - 1) * p forwards before the first backward, plus
      // the one in progress (Korthikanti: the first stage holds p * (1 + (p-1)/(p*v)) micro-batches' worth).
      chunk_units = std::min((p - stage - 1) * 2 + (v - 1) * p + 1, mbs * v);
      break;
  }
  double layers_per_chunk = static_cast<double>(mem.layers) / v;
  mem.inflight_microbatches = chunk_units / v;
  mem.activations_bytes = chunk_units * layers_per_chunk * layer_bytes;

  double e = activation_bytes(t.dtype);
  if (first) {
    double emb = 0;
    for (const Op& op : graph_.embedding)
      emb += op.saved_sequence_per_token / seq_div + op.saved_sharded_per_token / tp;
    mem.boundary_bytes += emb * tokens * mem.inflight_microbatches;
  }
  double transient = 0;
  if (c.recompute == Recompute::kFull) transient = full_layer;  // one layer recomputed in full
  if (dense_layers > 0) {
    // A dense layer's backward holds more than the saved activations it frees: the residual branch's gradient copy
    // and, at the activation's backward, the gradient of the fc1 output (gate and up) where the freed activation
    // output was (the executor's peak within a layer's backward).
    const double fc1 = static_cast<double>(m.fc1_columns(m.ffn_hidden)) / tp;
    transient = std::max(transient, tokens * e * (fc1 + static_cast<double>(m.hidden) / seq_div));
  }
  if (last) {
    double head = 0;
    for (const Op& op : graph_.head) head += op.saved_sequence_per_token / seq_div + op.saved_sharded_per_token / tp;
    mem.boundary_bytes += head * tokens;
    // The gradient of the logits, in the training dtype, while the saved logits are still held (the cross entropy's
    // backward reads one and writes the other).
    double vocab_shard = static_cast<double>(vocab_shard_rows(m, c.tp));
    transient = std::max(transient, tokens * vocab_shard * e);
  }
  if (c.cp > 1 && mem.layers > 0) transient = std::max(transient, cp_transient_bytes(c));
  mem.transient_bytes = transient;
  mem.reserved_bytes = cal.runtime_reserved_bytes();
  double tensors = mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes + mem.activations_bytes +
                   mem.boundary_bytes + mem.transient_bytes;
  mem.fragmentation_bytes = cal.memory_fragmentation * tensors;
  return mem;
}

// ---------------------------------------------------------------------------------------------------------------
// Whole step

ParallelConfig CostModel::complete(ParallelConfig c, std::int64_t global_batch) const {
  c.num_microbatches = static_cast<int>(global_batch / (static_cast<std::int64_t>(c.micro_batch) * c.dp));
  if (c.chunk_layers.empty()) c.chunk_layers = even_chunk_layers(static_cast<int>(model_.model.layers), c.chunks());
  if (model_.model.moe.enabled() && c.etp == 0) c.etp = c.tp;
  return c;
}

bool CostModel::repeats_previous_stage(const ParallelConfig& c, int s) const {
  if (!graph_.moe.empty() || s < 2 || s >= c.pp - 1) return false;
  for (int j = 0; j < c.vpp; ++j) {
    const auto ch = static_cast<std::size_t>(j) * static_cast<std::size_t>(c.pp) + static_cast<std::size_t>(s);
    if (c.chunk_layers[ch] != c.chunk_layers[ch - 1]) return false;
  }
  return true;
}

StageTimes CostModel::stage_pass_times(const ParallelConfig& c, const LayerCosts& lc, int s, int* layers) const {
  const int p = c.pp, chunks = c.chunks();
  StageTimes st;
  for (int j = 0, first = 0, walked = 0; j < c.vpp; ++j) {
    int ch = j * p + s;
    int n = c.chunk_layers[static_cast<std::size_t>(ch)];
    if (layers != nullptr) *layers += n;
    if (lc.moe != nullptr) {
      for (; walked < ch; ++walked) first += c.chunk_layers[static_cast<std::size_t>(walked)];
      st += chunk_times(lc, first, n, ch == 0, ch == chunks - 1);
      continue;
    }
    // A dense model: chunk_times without the layer count by kind (the search's innermost loop).
    st += scaled(lc.layer, static_cast<double>(n));
    if (ch == 0) st += lc.embedding;
    if (ch == chunks - 1) st += lc.head;
  }
  return with_fsdp(c, s, st);
}

double CostModel::shared_core_pipe(double pipe, double work, double balance, double contention, int p,
                                   int passes) const {
  const double ranks = cluster_.node.gpus, cores = cluster_.node.cores;
  const double reclaim = cluster_.node.gpu.calibration.idle_core_reclaim;
  auto faster = [&](double busy) { return 1 + reclaim * (ranks / std::max(busy, cores) - 1); };
  const int q = std::min(p, passes);
  const double d = (pipe - work) / (p - 1);  // one step of the fill (or the drain)
  double shared = 0;
  for (int k = 1; k < q; ++k) {
    const double busy = ranks * k / p;
    shared += 2 * d * (busy <= cores ? 1 - contention : 1) / faster(busy);
  }
  // The rest: q stages at work, each busy for `balance` of the slowest stage's time. (The transfers on the critical
  // path come on top; while they go on, the ranks at either end wait for each other and leave no one to speed up.)
  const double rest = std::max(0.0, pipe - 2.0 * (q - 1) * d);
  return shared + rest / faster(ranks * q / p * balance);
}

TimeBreakdown CostModel::step_time(const ParallelConfig& c, const LayerCosts& lc,
                                   std::vector<StageTimes>* stage_times) const {
  const auto& m = model_.model;
  const auto& cal = cluster_.calibration();
  const int p = c.pp, v = c.vpp, mbs = c.num_microbatches;
  if (stage_times != nullptr) stage_times->assign(static_cast<std::size_t>(p), StageTimes{});

  // Per-micro-batch time of each stage (the sum of its chunks), tracking the slowest.
  double overhead_per_mb = cal.microbatch_overhead_s * v;
  double t_max = 0, t_sum = 0, fill_sum = 0, fill_at_max = 0;
  StageTimes bottleneck;
  double max_params = 0, max_stage_experts = 0;
  int param_stage = 0;
  StageTimes param_stage_times;
  int slowest = 0;
  StageTimes st;
  int layers = 0;
  double params = 0;
  for (int s = 0; s < p; ++s) {
    if (!repeats_previous_stage(c, s)) {  // else the previous stage's st, layers and params hold for this one
      layers = 0;
      st = stage_pass_times(c, lc, s, &layers);
      params = lc.moe != nullptr ? stage_params(c, s) : stage_params(c, 0, layers, s == 0, s == p - 1);
    }
    if (stage_times != nullptr) (*stage_times)[static_cast<std::size_t>(s)] = st;
    double t = st.total() + overhead_per_mb;
    // Zero-bubble H1 fills the fill/drain with weight-gradient work: what remains per stage is
    // forward + input gradient - weight gradient.
    double fill = std::max(0.0, st.forward_s + st.backward_input_s - st.backward_weight_s + overhead_per_mb);
    t_sum += t;
    fill_sum += fill;
    if (t > t_max) {
      t_max = t;
      bottleneck = st;
      fill_at_max = fill;
      slowest = s;
    }
    if (params > max_params) {
      max_params = params;
      max_stage_experts = lc.moe != nullptr ? stage_expert_params(c, s) : 0.0;
      param_stage = s;
      param_stage_times = st;
    }
  }
  // Pipeline (Alpa/Metis): sum of stage times + (m - 1) x slowest; interleaving divides the fill and drain by vpp.
  double pipe = 0;
  switch (c.schedule) {
    case Schedule::kGpipe:
    case Schedule::k1F1B:
      pipe = t_sum + (mbs - 1) * t_max;
      break;
    case Schedule::kInterleaved:
      pipe = mbs * t_max + (t_sum - t_max) / v;
      break;
    case Schedule::kZbH1:
      pipe = mbs * t_max + (fill_sum - fill_at_max);
      break;
  }
  // CPU ranks sharing fewer cores than there are ranks: the calibrated figures are a rank's share with every rank
  // busy; while some wait, the busy ones run on the cores they leave, as much of them as [calibration]
  // idle_core_reclaim (e) says: with b of the R ranks busy on C cores a pass is faster by s(b) = 1 + e (R / max(b, C)
  // - 1). How many are busy changes over the step (shared_core_pipe): the fill and the drain, d = bubble / (p - 1)
  // each step of them, have k = 1 .. q - 1 of the p stages busy, the rest of the step q = min(p, micro-batches x vpp)
  // (its waits for slower stages counted). The passes are then faster on average by the base pipe over
  // the shared one (shared_core_speedup).
  double speedup = 1;
  const double reclaim = cluster_.node.gpu.calibration.idle_core_reclaim;
  if (p > 1 && cluster_.node.ranks_share_cores() && reclaim > 0) {
    // The slowest stage's share of time that is the contention of groups smaller than the node's ranks
    // (subgroup_sync_us), which a phase with no more ranks busy than cores does without.
    double contention = 0;
    if (uncontended_ != nullptr) {
      const double alone = uncontended_->stage_pass_times(c, uncontended_->layer_costs(c), slowest).total();
      contention = std::clamp(1 - (alone + overhead_per_mb) / t_max, 0.0, 1.0);
    }
    const double shared = shared_core_pipe(pipe, mbs * t_max, t_sum / p / t_max, contention, p, mbs * v);
    speedup = pipe / shared;
    t_max /= speedup;
    for (StageTimes* times : {&bottleneck, &param_stage_times}) *times = scaled(*times, 1 / speedup);
    if (stage_times != nullptr) {
      for (auto& times : *stage_times) times = scaled(times, 1 / speedup);
    }
    pipe = shared;
  }
  TimeBreakdown b;
  b.shared_core_speedup = speedup;
  b.recompute_s = mbs * bottleneck.recompute_s;
  b.tp_comm_s = mbs * bottleneck.tp_comm_s;
  b.ep_comm_s = mbs * bottleneck.ep_comm_s;
  b.cp_comm_s = mbs * bottleneck.cp_comm_s;
  const double fsdp_s = mbs * bottleneck.fsdp_comm_s;  // the FSDP collectives the passes do not hide
  b.compute_s = mbs * t_max - b.recompute_s - b.tp_comm_s - b.ep_comm_s - b.cp_comm_s - fsdp_s;
  b.bubble_s = pipe - mbs * t_max;

  // Pipeline transfers on the critical path: one per micro-batch and model chunk in the steady state, plus the
  // fill and drain hops.
  if (p > 1) b.pp_comm_s = p2p_seconds(c) * (static_cast<double>(mbs) * v + 2.0 * (p - 1));

  // Data-parallel reduction of the stage with the most parameters.
  double dp_s = dp_reduce_seconds(c, max_params, max_stage_experts);
  if (model_.training.overlap_grad_reduce && c.dp_cp() > 1 && !c.fsdp) {
    // Buckets reduce while the last micro-batch's backward is still running; what is left when it ends is exposed,
    // and never less than the last bucket.
    double window = param_stage_times.backward_input_s + param_stage_times.backward_weight_s;
    double buckets = std::max(1.0, std::ceil(max_params * grad_bytes_per_param(model_.training) / kBucketBytes));
    b.dp_comm_s = std::max(dp_s / buckets, dp_s - window);
  } else {
    b.dp_comm_s = dp_s;
  }
  b.dp_comm_s += fsdp_s;
  b.optimizer_s = optimizer_seconds(c, max_params, max_stage_experts) + fp8_step_seconds(c, param_stage);
  if (p > 1 && m.tied_embeddings) {
    // First and last stage sum the gradients of their copies of the word embeddings.
    GroupGeometry pair{2, 1, 2, false};
    if (pp_neighbours_share_node(c)) pair = GroupGeometry{2, 2, 1, true};
    double bytes = static_cast<double>(vocab_shard_rows(m, c.tp)) * m.hidden * grad_bytes_per_param(model_.training);
    b.optimizer_s += all_reduce_seconds(bytes, pair);
  }
  b.overhead_s = cal.step_overhead_s;
  return b;
}

double CostModel::peak_memory_bytes(const ParallelConfig& c, int* peak_stage) const {
  double peak = 0;
  for (int s = 0; s < c.pp; ++s) {
    if (repeats_previous_stage(c, s)) continue;  // never more than the stage before it
    double total = stage_memory(c, s).total_bytes();
    if (total > peak) {
      peak = total;
      if (peak_stage != nullptr) *peak_stage = s;
    }
  }
  return peak;
}

Estimate CostModel::evaluate(ParallelConfig c, std::int64_t global_batch) const {
  const auto& m = model_.model;
  if (auto problem = structural_problem(c, global_batch)) throw internal_error("evaluate: " + *problem);
  c = complete(std::move(c), global_batch);

  Estimate est;
  est.config = c;
  LayerCosts lc = layer_costs(c);
  est.breakdown = step_time(c, lc, &est.stage_times);
  est.p2p_s = p2p_seconds(c);
  double max_params = 0, max_stage_experts = 0;
  for (int s = 0; s < c.pp; ++s) {
    const double params = stage_params(c, s);
    if (params > max_params) {
      max_params = params;
      max_stage_experts = stage_expert_params(c, s);
    }
  }
  est.dp_reduce_s = dp_reduce_seconds(c, max_params, max_stage_experts);

  est.iteration_s = est.breakdown.total();
  double tokens = static_cast<double>(global_batch) * static_cast<double>(m.seq_len);
  double gpus = static_cast<double>(c.world_size());
  double peak = cluster_.node.gpu.peak_flops(model_.training.dtype);
  double model_flops = m.model_flops(tokens);
  // Recomputation FLOPs: full repeats every layer's forward (a third of its forward + backward work); selective
  // repeats the attention scores (4*s*h per token per layer).
  double layer_flops = model_flops - 6.0 * tokens * static_cast<double>(m.vocab) * m.hidden;
  double recompute_flops = 0;
  if (c.recompute == Recompute::kFull) recompute_flops = layer_flops / 3.0;
  if (c.recompute == Recompute::kSelective) {
    recompute_flops = 4.0 * static_cast<double>(m.seq_len) * m.hidden * static_cast<double>(m.layers) * tokens;
  }
  est.tokens_per_s = tokens / est.iteration_s;
  est.tflops_per_gpu = model_flops / est.iteration_s / gpus / 1e12;
  est.mfu = model_flops / (est.iteration_s * gpus * peak);
  est.hfu = (model_flops + recompute_flops) / (est.iteration_s * gpus * peak);

  est.capacity_bytes = cluster_.node.gpu.memory_bytes();
  for (int s = 0; s < c.pp; ++s) {
    est.stages.push_back(stage_memory(c, s));
    double total = est.stages.back().total_bytes();
    if (total > est.peak_memory_bytes) {
      est.peak_memory_bytes = total;
      est.peak_stage = s;
    }
  }
  est.feasible = est.peak_memory_bytes <= est.capacity_bytes;
  if (!est.feasible) {
    est.reason = fmt::format("stage {} needs {:.1f} GiB, the GPU has {:.1f} GiB", est.peak_stage,
                             est.peak_memory_bytes / kGiB, est.capacity_bytes / kGiB);
  }
  return est;
}

}  // namespace dtrain::plan
