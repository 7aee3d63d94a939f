// The cost model: predicted step time and per-stage memory of a parallel layout of a model on a cluster.
//
// Every formula, its source and its calibration are in docs/cost-model.md. In short:
//   - compute per op: max(FLOPs / (peak x gemm_efficiency(FLOPs)), bytes / (HBM x hbm_efficiency));
//   - collectives: latency x steps + algorithm factor x bytes / (bandwidth x efficiency(bytes)), hierarchical
//     (inside the NVLink domain, then across nodes) when a group spans nodes;
//   - pipeline: sum of stage times + (m - 1) x slowest stage for 1F1B (interleaved: bubble / vpp; zb-h1: weight
//     gradients fill the bubble), plus the point-to-point transfers on the critical path;
//   - data-parallel reduction bucketed and overlapped with the last micro-batch's backward except its tail;
//   - memory per pipeline stage: weights, gradients, optimizer state (sharded with the distributed optimizer),
//     activations of the micro-batches in flight (Korthikanti et al. 2022), embedding and logits, workspace,
//     fragmentation.
// The same per-instruction costs serve the IR simulator (dtrain::ir), so the analytic estimate and the simulated
// lowered programs can be compared.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/model/layer_graph.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/config.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::plan {

// Bytes in a GiB: memory in reports and messages.
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Bytes of one parameter's weight in the training dtype.
inline double weight_bytes_per_param(DType dtype) { return dtype == DType::kFp32 ? 4.0 : 2.0; }

// Bytes of one parameter's gradient: Megatron keeps fp32 main gradients unless told to reduce in the training dtype.
inline double grad_bytes_per_param(const model::TrainingSpec& t) {
  return (t.grad_reduce_fp32 || t.dtype == DType::kFp32) ? 4.0 : weight_bytes_per_param(t.dtype);
}

// Why context parallelism cannot cut `model`'s sequences as `config` asks ("cp=3 needs seq_len=1000 divisible by
// 2*cp=6"), or nullopt: the sequence must split into 2 * cp equal chunks (and each rank's tokens over tp with
// sequence parallelism); cp_comm = a2a needs cp to divide each tensor-parallel rank's heads and key/value heads.
std::optional<std::string> cp_problem(const model::ModelSpec& model, const ParallelConfig& config);

struct TimeBreakdown {
  double compute_s = 0;    // forward + backward math on the slowest stage, all micro-batches
  double recompute_s = 0;  // forward recomputation (selective or full)
  double tp_comm_s = 0;    // exposed tensor-parallel collectives
  double ep_comm_s = 0;    // expert-parallel all-to-all (an MoE model's dispatch and combine)
  double cp_comm_s = 0;    // context-parallel K/V exchanges the attention does not hide
  double bubble_s = 0;     // pipeline fill and drain
  double pp_comm_s = 0;    // exposed pipeline point-to-point transfers
  double dp_comm_s = 0;    // exposed data-parallel reduction (and parameter all-gather)
  double optimizer_s = 0;  // optimizer step, gradient norm, tied-embedding reduction, FP8 weight casts and amaxes
  double overhead_s = 0;   // fixed per-step overhead
  // CPU ranks sharing fewer cores ([node] cores): how much faster the passes run than the calibrated per-rank figures
  // say, because the ranks are not all busy at once (a pipeline's fill and drain); 1 otherwise. Applied already.
  double shared_core_speedup = 1;
  double total() const {
    return compute_s + recompute_s + tp_comm_s + ep_comm_s + cp_comm_s + bubble_s + pp_comm_s + dp_comm_s +
           optimizer_s + overhead_s;
  }
};

struct StageMemory {
  int stage = 0;
  int layers = 0;
  double params = 0;  // parameters held by one GPU of this stage
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;  // transformer layers' saved activations, all micro-batches in flight
  double boundary_bytes = 0;     // embedding and head activations (first and last stage)
  double transient_bytes = 0;    // largest short-lived buffer: a recomputed layer, the logits
  double reserved_bytes = 0;     // CUDA context, library workspaces, communication buffers
  double fragmentation_bytes = 0;
  double inflight_microbatches = 0;  // micro-batches whose activations are alive at the peak (chunk units / vpp)
  // Korthikanti-comparable parts: transformer layers only.
  double layer_params = 0;
  double layer_state_bytes = 0;  // (weights + gradients + optimizer) of the transformer layers
  double total_bytes() const {
    return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes + boundary_bytes + transient_bytes +
           reserved_bytes + fragmentation_bytes;
  }
};

// Per-micro-batch cost of one pipeline stage, split the way schedules need it.
struct StageTimes {
  double forward_s = 0;          // compute + exposed tp collectives of the forward pass
  double backward_input_s = 0;   // input gradients (+ recomputation, + tp collectives of backward)
  double backward_weight_s = 0;  // weight gradients (separable in zero-bubble schedules)
  double recompute_s = 0;        // part of backward_input_s that is recomputation
  double tp_comm_s = 0;          // part of the three passes' times that is tp communication
  double ep_comm_s = 0;          // part of forward_s + backward_input_s that is expert-parallel all-to-all
  double fsdp_comm_s = 0;        // part of the three that is exposed FSDP parameter all-gathers / grad reduce-scatters
  double cp_comm_s = 0;          // part of the three that is exposed context-parallel K/V exchanges
  double total() const { return forward_s + backward_input_s + backward_weight_s; }
};

struct Estimate {
  ParallelConfig config;
  bool feasible = false;
  std::string reason;  // why not feasible (memory), empty when feasible
  TimeBreakdown breakdown;
  double iteration_s = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  // model FLOPs per second per GPU (no recomputation)
  double mfu = 0;             // model FLOPs utilisation
  double hfu = 0;             // hardware FLOPs utilisation (recomputation counted)
  std::vector<StageMemory> stages;
  double peak_memory_bytes = 0;
  int peak_stage = 0;
  double capacity_bytes = 0;
  std::vector<StageTimes> stage_times;  // per micro-batch
  double p2p_s = 0;                     // one pipeline transfer between stages
  double dp_reduce_s = 0;               // full data-parallel reduction of the largest stage, before overlap
};

// Per-micro-batch costs of one transformer layer and of the embedding and head, for one (tp, micro_batch,
// sequence_parallel, recompute) combination: what every stage time is assembled from.
struct LayerCosts {
  StageTimes layer;      // a dense layer
  StageTimes moe_layer;  // an MoE layer (an MoE model's)
  StageTimes embedding;
  StageTimes head;
  const std::vector<bool>* moe = nullptr;  // per layer: MoE (the layer graph's), nullptr for a dense model

  const StageTimes& at(int l) const {
    return moe != nullptr && l >= 0 && static_cast<std::size_t>(l) < moe->size() && (*moe)[static_cast<std::size_t>(l)]
               ? moe_layer
               : layer;
  }
};

// Shape of a communication group on the cluster.
struct GroupGeometry {
  int size = 1;
  int per_node = 1;    // members on one node
  int nodes = 1;       // nodes spanned
  bool nvlink = true;  // members on one node share the NVLink domain
};

class CostModel {
 public:
  CostModel(model::ModelDescription model, topology::ClusterSpec cluster);

  const model::ModelDescription& model() const { return model_; }
  const topology::ClusterSpec& cluster() const { return cluster_; }
  const model::LayerGraph& graph() const { return graph_; }

  // Why a layout cannot run at all (heads not divisible, batch not divisible, ...), or nullopt. Memory is not
  // checked here (see evaluate).
  std::optional<std::string> structural_problem(const ParallelConfig& config, std::int64_t global_batch) const;

  // Full evaluation. config.num_microbatches and config.chunk_layers are filled in when empty/zero.
  Estimate evaluate(ParallelConfig config, std::int64_t global_batch) const;

  // Memory only (for pruning before timing): peak bytes over stages; config must be complete (num_microbatches,
  // chunk_layers). Allocates nothing.
  double peak_memory_bytes(const ParallelConfig& config, int* peak_stage = nullptr) const;
  StageMemory stage_memory(const ParallelConfig& config, int stage) const;

  // Step time only, allocating nothing (the search's inner loop); config must be complete. When stage_times is
  // given it receives the per-micro-batch time of every stage.
  LayerCosts layer_costs(const ParallelConfig& config) const;
  TimeBreakdown step_time(const ParallelConfig& config, const LayerCosts& costs,
                          std::vector<StageTimes>* stage_times = nullptr) const;
  // Fills num_microbatches (from global_batch) and chunk_layers (even split) when missing.
  ParallelConfig complete(ParallelConfig config, std::int64_t global_batch) const;

  // ---- building blocks, shared with the IR simulator ----
  double gemm_seconds(double m, double n, double k) const;
  double memory_seconds(double bytes) const;
  // Forward time of one op for a micro-batch under tp / sequence parallelism (compute only).
  double op_forward_seconds(const model::Op& op, const ParallelConfig& config) const;
  double op_backward_seconds(const model::Op& op, const ParallelConfig& config) const;
  // A fused (flash) attention op over this rank's heads and tokens: its FLOPs at the attention efficiency of the pass,
  // or its bytes where those take longer. The backward's factor is the caller's.
  double flash_attention_seconds(const model::Op& op, const ParallelConfig& config, bool backward) const;
  // Weight-gradient part of op_backward_seconds (GEMMs only).
  double op_weight_grad_seconds(const model::Op& op, const ParallelConfig& config) const;

  // ---- FP8 GEMMs ([training] fp8; cost_model_fp8.cc, docs/cost-model.md#fp8) ----
  // Whether op's GEMMs run in FP8: a transformer layer's linear layers (attention projections, MLP, shared and routed
  // experts) under [training] fp8, not the router (replicated) nor the output layer (vocabulary-parallel).
  bool fp8_gemm(const model::Op& op) const {
    return fp8_ && op.kind == model::OpKind::kLinear && op.split != model::TpSplit::kVocab &&
           op.split != model::TpSplit::kReplicated;
  }
  // An m x n x k GEMM on FP8 operands (1 byte each, the output 2): the GEMM curve's efficiency times
  // fp8_gemm_efficiency, at the GPU's FP8 peak.
  double fp8_gemm_seconds(double m, double n, double k) const;
  // Casting `elements` bf16 values to FP8, row-wise and transposed (read 2 bytes, write 2) with their amax: a
  // linear layer's input in the forward pass, its output gradient in the backward.
  double fp8_cast_seconds(double elements) const;
  // Once per step on the stage with the most parameters: casting its FP8 layers' weights (read 2 bytes, write 2),
  // and with the delayed recipe the all-reduce of every FP8 tensor's amax over the data- and tensor-parallel ranks.
  double fp8_step_seconds(const ParallelConfig& config, int stage) const;
  // Per layer and pass, the tensorwise recipe under sequence parallelism: the all-reduces of the FP8 inputs' amaxes
  // over the tensor-parallel group (two per pass); 0 otherwise.
  double fp8_amax_tp_seconds(const ParallelConfig& config) const;
  // The parameters one GPU of `stage` holds in FP8 GEMMs' weights (the FP8 copies' count; 0 without FP8).
  double fp8_weight_params(const ParallelConfig& config, int stage) const;

  // ---- Fully sharded data parallelism (ParallelConfig::fsdp; cost_model_fsdp.cc, docs/cost-model.md#fsdp) ----
  // A stage's per-micro-batch times with its FSDP collectives: each unit (a layer, the embedding, the head) is
  // all-gathered before its forward and its backward and its gradients reduce-scattered after its backward, the next
  // unit's while this one computes; what the computation does not hide is exposed (fsdp_comm_s). `st` without them.
  StageTimes with_fsdp(const ParallelConfig& config, int stage, StageTimes st) const;
  // The parameters of the largest unit of `stage` one GPU gathers (its tensor-parallel shard, whole over dp).
  double fsdp_unit_params(const ParallelConfig& config, int stage) const;
  // The embedding's and the head's units of `stage` (0 where it has none), less the tied matrix fsdp holds whole
  // (pp = 1: the embedding's; pp > 1: each end stage's copy).
  std::pair<double, double> fsdp_end_units(const ParallelConfig& config, int stage) const;
  // Parameters of which `expert_params` routed experts', as one GPU holds them sharded: the dense ones over dp, the
  // routed experts over the dp / ep ranks holding them (the distributed optimizer's state has the same shards).
  double sharded_params(const ParallelConfig& config, double params, double expert_params) const;
  // Tied word embeddings under fsdp (model::tied_matrix_apart): the parameters of the tied matrix one GPU of `stage`
  // holds whole beside its shards (the first stage's, and the last stage's copy), 0 elsewhere or without fsdp.
  double fsdp_whole_params(const ParallelConfig& config, int stage) const;
  // The step's collectives of that matrix (after the backward, after the optimizer step); 0 without it.
  double fsdp_tied_seconds(const ParallelConfig& config) const;

  // ---- Context parallelism (ParallelConfig::cp; cost_model_cp.cc, docs/cost-model.md#context-parallelism) ----
  // The cp ranks of one replica (consecutive data-parallel-with-cp ranks).
  GroupGeometry cp_group(const ParallelConfig& config) const;
  // This rank's keys and values of one layer for one micro-batch (its 2 chunks of every sequence, its kv heads).
  double cp_kv_bytes(const ParallelConfig& config) const;
  // This rank's queries of one layer for one micro-batch (its 2 chunks of every sequence, its heads), in elements.
  double cp_query_elements(const ParallelConfig& config) const;
  // The K/V exchanges of one layer's attention that its computation does not hide, forward and backward, given the
  // attention's own time in that pass: p2p a ring of cp - 1 steps each hidden behind 1/cp of the attention;
  // all_gather the whole sequence's K/V gathered before (and again for the backward, whose K/V gradients are
  // reduce-scattered after); a2a two all-to-alls re-splitting the sequence into heads and back (four in the backward).
  double cp_forward_seconds(const ParallelConfig& config, double attention_s) const;
  double cp_backward_seconds(const ParallelConfig& config, double attention_s) const;
  // The largest buffer context parallelism adds to a layer's pass (the gathered K/V and their gradients, or the
  // ring's chunks in flight).
  double cp_transient_bytes(const ParallelConfig& config) const;

  double all_reduce_seconds(double bytes, const GroupGeometry& g) const;
  double all_gather_seconds(double bytes, const GroupGeometry& g) const;  // bytes: the gathered (full) size
  double reduce_scatter_seconds(double bytes, const GroupGeometry& g) const;
  // One pipeline transfer of an activation (or its gradient) between stage s and s+1.
  double p2p_seconds(const ParallelConfig& config) const;

  GroupGeometry tp_group(const ParallelConfig& config) const;
  GroupGeometry dp_group(const ParallelConfig& config) const;
  // The expert-parallel group: ep consecutive data-parallel ranks.
  GroupGeometry ep_group(const ParallelConfig& config) const;
  // The expert data-parallel group: the dp x cp / ep data-parallel ranks that hold the same experts (every ep-th one).
  GroupGeometry edp_group(const ParallelConfig& config) const;
  // One all-to-all in which every member sends `bytes` in all, split evenly over the members (itself included).
  double all_to_all_seconds(double bytes, const GroupGeometry& g) const;
  // Whether pipeline neighbours always share a node.
  bool pp_neighbours_share_node(const ParallelConfig& config) const;

  // Tokens of one micro-batch this rank's layers see: micro_batch x seq_len / cp.
  double local_tokens(const ParallelConfig& config) const {
    return static_cast<double>(config.micro_batch) * static_cast<double>(model_.model.seq_len) / config.cp;
  }
  // Bytes of the tensor-parallel all-reduce of one layer output (local tokens x hidden x activation bytes).
  double hidden_bytes(const ParallelConfig& config) const;
  // Tensor-parallel collective time of one transformer layer's forward / backward pass.
  double layer_tp_forward_seconds(const ParallelConfig& config) const;
  double layer_tp_backward_seconds(const ParallelConfig& config) const;
  // With sequence parallelism: the all-gathers of saved input shards for the weight gradients of `ops`' column-parallel
  // layers (routed-expert MLPs keep their gathered input and need none).
  double regather_seconds(const std::vector<model::Op>& ops, const ParallelConfig& config) const;
  // A pipe of `pipe` seconds (the calibrated figures' speed, every rank busy), `work` of them the slowest stage's
  // passes, on CPU ranks that share fewer cores: the pipe when the busy ranks take up the waiting ones' cores
  // ([calibration] idle_core_reclaim), phase by phase (see step_time). `balance`: the mean stage's share of the
  // slowest one's time; `contention`: the share of a pass that is subgroup_sync_us, gone while no more ranks than
  // cores are busy; `passes`: micro-batches x vpp.
  double shared_core_pipe(double pipe, double work, double balance, double contention, int p, int passes) const;
  // Whether pipeline stage s (1 < s < pp - 1) of a dense model is stage s - 1 again: its chunks hold the same layers
  // and neither the embedding nor the head, so its pass times, parameters and memory but for its in-flight
  // micro-batches (never more than s - 1's) are the same. The search's inner loops skip such stages (most of them
  // with pp = 64 or 128).
  bool repeats_previous_stage(const ParallelConfig& config, int s) const;
  // Per-micro-batch time of pipeline stage s (its chunks' sum); adds its layers to *layers when given.
  StageTimes stage_pass_times(const ParallelConfig& config, const LayerCosts& costs, int s,
                              int* layers = nullptr) const;
  // Per-micro-batch cost of a model chunk of layers [first_layer, first_layer + layers), with the embedding and/or
  // head when asked.
  StageTimes chunk_times(const ParallelConfig& config, int first_layer, int layers, bool embedding, bool head) const;
  static StageTimes chunk_times(const LayerCosts& costs, int first_layer, int layers, bool embedding, bool head);
  // Data-parallel gradient reduction of `params` parameters (sharded: reduce-scatter + parameter all-gather), of
  // which `expert_params` routed experts' (with ep > 1 reduced over the edp group, the rest over dp).
  double dp_reduce_seconds(const ParallelConfig& config, double params, double expert_params = 0) const;
  double optimizer_seconds(const ParallelConfig& config, double params, double expert_params = 0) const;
  // Of `params` parameters held (`expert_params` of them routed experts'), those whose optimizer state this GPU
  // keeps: all of them, or with the distributed optimizer its share (the rest over dp, the experts over edp).
  double optimizer_state_params(const ParallelConfig& config, double params, double expert_params) const;
  // Parameters one GPU holds for layers [first_layer, first_layer + layers), with embedding/head.
  double stage_params(const ParallelConfig& config, int first_layer, int layers, bool embedding, bool head) const;
  // Parameters one GPU of pipeline stage `stage` holds (all its model chunks); config.chunk_layers must be set.
  double stage_params(const ParallelConfig& config, int stage) const;
  // Parameters one GPU holds of layer l (dense or MoE).
  double layer_params(const ParallelConfig& config, int layer) const;
  // Of those, the routed experts' (split over etp and ep; 0 for a dense layer).
  double expert_layer_params(const ParallelConfig& config, int layer) const;
  // The routed experts' parameters one GPU holds of layers [first_layer, first_layer + layers), and of pipeline stage
  // `stage` (config.chunk_layers set).
  double expert_params(const ParallelConfig& config, int first_layer, int layers) const;
  double stage_expert_params(const ParallelConfig& config, int stage) const;
  // How many ways an MoE layer's experts (routed and shared) are split: etp (which is tp unless set to 1).
  static int moe_tp(const ParallelConfig& c) { return c.etp > 0 ? c.etp : c.tp; }
  // Whether the MoE MLP runs on each tensor-parallel rank's own tokens with whole experts (etp = 1 under tp > 1).
  static bool moe_token_parallel(const ParallelConfig& c) { return c.etp == 1 && c.tp > 1; }
  double bucket_bytes() const { return kBucketBytes; }

  static constexpr double kBucketBytes = 40.0 * 1024 * 1024;  // Megatron's default DDP bucket (40 MB)

 private:
  // One linear op's GEMMs on this rank: `groups` GEMMs of rows x out x in (one per local expert, priced as one grouped
  // call, or a single one), each in FP8 or not (fp8_gemm).
  struct LinearGemm {
    double groups = 1, rows = 0, out = 0, in = 0;
    bool fp8 = false;
    double seconds(const CostModel& cm) const {
      return groups * (fp8 ? cm.fp8_gemm_seconds(rows, out, in) : cm.gemm_seconds(rows, out, in));
    }
  };
  LinearGemm linear_gemm(const model::Op& op, const ParallelConfig& config) const;
  double collective_seconds(double bytes, const GroupGeometry& g, double bw_factor, int steps_factor) const;
  // op_backward_seconds with the op's forward time already known (ops_times: the search's inner loop).
  double backward_seconds(const model::Op& op, const ParallelConfig& config, double forward_s) const;
  // The bucketed reduction of `params` parameters' gradients over the group `g` (dp_reduce_seconds).
  double bucket_reduce_seconds(const ParallelConfig& c, double params, const GroupGeometry& g) const;
  // `size` data-parallel ranks `step` apart.
  GroupGeometry data_parallel_ranks(const ParallelConfig& config, int size, int step = 1) const;
  // Parameters one GPU holds of `dense` dense and `moe` MoE layers (inline: the search's inner loop).
  double layers_params(const ParallelConfig& c, int dense, int moe) const {
    const double tp = c.tp;
    return static_cast<double>(dense) * (layer_params_sharded_ / tp + layer_params_replicated_) +
           static_cast<double>(moe) * (moe_params_sharded_ / tp + moe_params_replicated_ +
                                       moe_shared_params_ / moe_tp(c) + moe_layer_expert_params(c));
  }
  // An MoE layer's routed experts' parameters one GPU holds (split over etp and ep).
  double moe_layer_expert_params(const ParallelConfig& c) const { return moe_expert_params_ / (moe_tp(c) * c.ep); }
  // The MoE layers among a stage's (an MoE model's).
  int stage_moe_layers(const ParallelConfig& config, int stage) const;
  // The compute of one pass over `ops` (forward, backward split into input and weight gradients, and selective
  // recomputation), each at least the ops' count times the host's floor per op.
  StageTimes ops_times(const std::vector<model::Op>& ops, const ParallelConfig& config) const;
  StageTimes layer_times(const std::vector<model::Op>& ops, const ParallelConfig& config) const;

  model::ModelDescription model_;
  topology::ClusterSpec cluster_;
  model::LayerGraph graph_;
  double layer_params_sharded_ = 0;     // dense layer parameters split by tp
  double layer_params_replicated_ = 0;  // norms, row-parallel biases
  double moe_params_sharded_ = 0;       // the same of an MoE layer without its experts and shared experts
  double moe_params_replicated_ = 0;    // ... and the router, replicated
  double moe_expert_params_ = 0;        // an MoE layer's routed experts (split by etp and by ep)
  double moe_shared_params_ = 0;        // its shared experts (split by etp)
  bool fp8_ = false;                    // [training] fp8
  // CPU ranks sharing fewer cores, with [network] subgroup_sync_us: this model without it (what a pass costs while
  // no more ranks than cores are busy); nullptr otherwise.
  std::shared_ptr<const CostModel> uncontended_;
};

}  // namespace dtrain::plan
