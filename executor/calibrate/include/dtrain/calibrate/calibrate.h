// Calibration (dtrain::calibrate, behind `dtplan calibrate`): measures dtrain's own kernels on this machine, as the
// ranks of a job would run them, and fits the figures of the cost model (docs/cost-model.md, "Calibrating a machine").
// Two devices:
//
// CPU (calibrate_cpu, src/calibrate.cc). What runs: `ranks` worker threads at once, each with its own buffers,
// each the kernels a rank of that many per node would run, with the thread count dtexec gives a rank (cores / ranks, at
// least 1). So the figures are per rank and include the sharing of cores and memory bandwidth between the ranks of a
// node (exact when each rank has one thread, the usual case of several CPU ranks on one machine; with more, OpenBLAS's
// one process-wide pool is shared by the workers, which ranks in separate processes would not do).
//
//   GEMM       kernels::cpu::linear_forward over (tokens, out, in) shapes: time = (flops + h) / P fitted by least
//              squares on relative error, giving the peak P (tflops_fp32, gemm_efficiency_max = 1) and the half-size h
//              (gemm_half_gflop): a GEMM of h flops runs at half the peak.
//   memory     rmsnorm forward over rows large enough to leave the caches: bytes read and written per second
//              (hbm_gbps, hbm_efficiency = 1).
//   attention  kernels::cpu::attention_forward and backward (causal, GQA) across sequence lengths: FLOP rate over P
//              (attention_efficiency).
//   all-reduce Gloo over loopback between `ranks` threads (how the CPU ranks of a node communicate) at 4 KB to 8 MB:
//              the latency per ring step from the smallest size, the bus bandwidth 2 (n-1)/n bytes / time at the
//              largest (node nvlink_gbps: the "NVLink domain" of a CPU node is its shared memory and loopback), and the
//              efficiency at each size (the [[network.efficiency]] curve of scope "nvlink" for n participants).
// Point-to-point latency, links between nodes and the per-step overheads are the base cluster's.
//
// GPU (calibrate_cuda, src/calibrate_cuda.cc): dtrain's CUDA kernels on GPU 0, one kernel at a time on one stream,
// timed by the wall clock around back-to-back calls with the stream synchronised before and after (the median of the
// repetitions):
//   GEMM       cuda::linear_forward, linear_backward_input and linear_backward_weight (cuBLASLt, bf16) over the shapes
//              of the layers dtrain trains and their tensor-parallel shards: the same fit as on the CPU, over all
//              three passes (the cost model prices each pass by its FLOPs alone).
//   memory     the memory-bound kernels of a layer (RMSNorm forward and backward, SwiGLU forward and backward, the
//              residual add, RoPE, AdamW), each by the bytes it must read and write: the bandwidth is their summed
//              bytes over their summed time.
//   attention  cuda::attention_forward and backward (the kernel kAuto picks: tensor cores where they apply) at head
//              sizes 64 and 128 across sequence lengths.
//   experts    cuda::grouped_linear_* (the experts' grouped GEMMs, all three passes) for 8 experts of MoE layer shapes,
//              against the plain GEMM curve's time for the same groups (expert_gemm_efficiency).
//   launch     one tiny kernel launched back to back: the cost of a launch.
// Communication between GPUs (NCCL) is the base cluster's: measuring it needs two or more GPUs in one machine.
//
// Both devices end with the executor probe (probe_executor, src/probe.cc): dtexec, found beside the running program
// (dtplan), trains a 2-layer Llama for 8 to 24 steps on the device (one rank, two micro-batches, --trace), with the
// figures measured so far. Its measured timeline against the simulator's timeline of the same plan
// (dtrain/ir/compare.h) gives what kernels alone cannot: the step's time outside the instructions (step_overhead_s),
// the gaps between instructions per micro-batch (microbatch_overhead_s), and the bandwidth the executor's memory-bound
// work really reaches, counted in the cost model's bytes (hbm_efficiency: the forward and backward passes' time beyond
// the GEMMs and attention). With several CPU ranks per node a second run, tensor-parallel over all of them under
// dtlaunch, gives what a collective between the ranks really costs inside the passes (waits for the slowest rank and
// the sharing of the cores included): run twice, with collectives of one and of four sequences, it fits [network]
// collective_sync_us and [node] nvlink_gbps so that the simulator's passes match the measured ones.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/calibrate/fit.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::calibrate {

struct CalibrateOptions {
  int ranks = 1;       // ranks per node measured together
  bool quick = false;  // fewer shapes and repetitions (about a quarter of the time)
  double budget_s = 60;
};

struct GemmPoint {
  std::int64_t m = 0, n = 0, k = 0;  // tokens, out features, in features
  double seconds = 0;                // median per call, per rank
  std::string pass = "forward";      // forward, backward_input, backward_weight
};

struct AttentionPoint {
  std::int64_t seq = 0;
  double forward_s = 0, backward_s = 0;
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0, batch = 1;
};

// One memory-bound kernel: the bytes it must move (reads and writes) and its median time.
struct MemoryPoint {
  std::string op;
  double bytes = 0;
  double seconds = 0;
};

struct CollectivePoint {
  std::int64_t bytes = 0;
  double seconds = 0;  // median all-reduce time
};

// What the executor probe measured (see above).
struct ProbeFigures {
  double step_s = 0;              // median step (dtexec metrics)
  double span_s = 0;              // median span of the step's instructions
  double predicted_passes_s = 0;  // forward and backward passes per step, by the figures before the probe
  double measured_passes_s = 0;
  double hbm_efficiency = 0;
  double compute_speedup = 1;  // CPU: the GEMM peak's factor where the passes ran faster than it predicts
  double microbatch_overhead_s = 0;
  double step_overhead_s = 0;
  // CPU, several ranks per node: the fixed cost of one collective between them and the latency per ring step, fitted
  // to three tensor-parallel runs (collectives of one and of four sequences, and of one sequence with sequence
  // parallelism).
  std::optional<double> collective_sync_us;
  std::optional<double> nvlink_latency_us;
  // CPU, several ranks per node: the bandwidth of a collective between them, fitted to the gradients' collectives of
  // a data-parallel run over all of them (before the tensor-parallel runs, which are priced with it), and what those
  // collectives took per step in that run.
  std::optional<double> nvlink_gbps;
  std::optional<double> dp_collectives_s;
  // CPU, four ranks per node or more: what a collective of a group of two costs more, from a run with dp = ranks / 2.
  std::optional<double> subgroup_sync_us;
  // CPU, more ranks per node than cores: the cores, and the fraction of a waiting rank's share of them that the busy
  // ranks take up, fitted to a pipeline run (dp = ranks / 2, pp = 2).
  int cores = 0;
  std::optional<double> idle_core_reclaim;
  // The point-to-point latency of one pipeline over all the ranks (pp = ranks): what its step takes beyond the passes
  // and the transfers' bytes; and what a transfer costs more for each further pipeline on the node, from the run
  // above (its ranks / 2 - 1 further pipelines).
  std::optional<double> p2p_latency_us;
  std::optional<double> p2p_pipelines_us;
  // GPU: the host's floor per op of a forward and of a backward pass, from a second run of a small model.
  std::optional<double> host_op_forward_us;
  std::optional<double> host_op_backward_us;
};

struct CalibrationResult {
  std::string device = "cpu";    // "cpu" or "cuda"
  std::string device_name;       // cuda: the GPU as the driver names it
  double device_memory_gib = 0;  // cuda: the GPU's memory as the driver reports it
  int ranks = 1;
  int threads_per_rank = 1;
  bool quick = false;  // --quick: the probes train 8 steps each (longer ones steady the figures)
  std::vector<GemmPoint> gemms;
  // cuda: the experts' grouped GEMMs (8 groups of m rows each), and their rate against the fitted curve's for the same
  // groups (1: none measured).
  std::vector<GemmPoint> grouped_gemms;
  double expert_gemm_efficiency = 1;
  double peak_flops = 0;      // fitted P
  double half_flops = 0;      // fitted h
  double gemm_fit_error = 0;  // mean relative error of the fit over the shapes
  double memory_bytes_per_s = 0;
  std::vector<MemoryPoint> memory_ops;  // cuda: every memory-bound kernel measured
  double launch_s = 0;                  // cuda: one kernel launch, back to back
  std::vector<AttentionPoint> attention;
  double attention_efficiency = 0;
  // All-reduce over Gloo between the `ranks` (loopback TCP, as CPU ranks of one node communicate); empty for one rank.
  std::vector<CollectivePoint> all_reduce;
  double bus_bytes_per_s = 0;           // the ring's bus bandwidth at the largest size
  double latency_s = 0;                 // per ring step, from the smallest size
  std::vector<double> comm_efficiency;  // per all_reduce point: the cost model's efficiency curve
  std::optional<ProbeFigures> probe;    // absent when no dtexec is beside dtplan
  double seconds = 0;                   // the run's duration
};

// Measures and fits; `progress` gets one line per part. Stops early (throwing dtrain::Error, exit 10) when `stop()`
// turns true between measurements.
CalibrationResult calibrate_cpu(const CalibrateOptions& options,
                                const std::function<void(const std::string&)>& progress,
                                const std::function<bool()>& stop);

// Runs the executor probe on the device of `r` with the cluster `measured` (calibrated_cluster's, before the probe).
// nullopt, saying so through `progress`, when no dtexec is beside this dtplan. Throws dtrain::Error when the probe's
// run fails (naming its exit and output) or is interrupted (exit 10).
std::optional<ProbeFigures> probe_executor(const topology::ClusterSpec& measured, const CalibrationResult& r,
                                           const std::function<void(const std::string&)>& progress,
                                           const std::function<bool()>& stop);

// Measures GPU 0 with dtrain's CUDA kernels (see above); `ranks` GPUs per node go into the cluster. Throws
// dtrain::Error: exit 2 when this dtplan was built without CUDA, when no GPU can be used (naming why) or when the
// machine has fewer GPUs than `ranks`; exit 10 when interrupted, as calibrate_cpu.
CalibrationResult calibrate_cuda(const CalibrateOptions& options,
                                 const std::function<void(const std::string&)>& progress,
                                 const std::function<bool()>& stop);

// The base cluster a CPU calibration starts from without --base: this machine as one node whose "GPUs" are CPU ranks
// (one per core, as examples/clusters/local-cpu.toml), with that file's loopback figures for what is not measured.
topology::ClusterSpec default_cpu_base();

// The base cluster a GPU calibration starts from without --base: one node of `r.ranks` GPUs of the catalog entry that
// matches the GPU's name (datasheet peaks), or, for a GPU the catalog does not know, one whose peak and bandwidth are
// the measured ones. Its other figures (links, latencies, overheads) are examples/clusters/dgx-h100.toml's.
topology::ClusterSpec default_cuda_base(const CalibrationResult& r);

// The base cluster with the measured figures in place of its own (`ranks` GPUs per node):
//   cpu:  [gpu] tflops_fp32 (and the bf16 rate) and hbm_gbps are the measured peak and bandwidth per rank,
//         gemm_half_gflop and attention_efficiency, the all-reduce figures;
//   cuda: the [gpu] datasheet figures stay; gemm_efficiency_max, gemm_half_gflop and attention_efficiency are the
//         measured fractions of them; expert_gemm_efficiency the grouped GEMMs' rate against the plain ones';
//   both: optimizer_hbm_efficiency from AdamW; with the probe (r.probe, apply_probe), hbm_efficiency, the overheads
//         and (CPU) the GEMM peak's factor, with several ranks collective_sync_us, nvlink_latency_us and
//         subgroup_sync_us, with more ranks than cores [node] cores, idle_core_reclaim, p2p_latency_us and
//         p2p_pipelines_us; (GPU) host_op_forward_us and host_op_backward_us.
topology::ClusterSpec calibrated_cluster(const topology::ClusterSpec& base, const CalibrationResult& r);

// The probe's figures on `c` (the cluster of the kernel figures alone: the GEMM peak is multiplied, not set): what
// calibrated_cluster does with r.probe, and the probe itself with its first figures before its later runs.
void apply_probe(topology::ClusterSpec& c, const ProbeFigures& f);

// calibrated_cluster as cluster.toml text with a [provenance] table (host, device, date, version, duration) that
// loads wherever a cluster.toml does.
std::string calibrated_cluster_toml(const topology::ClusterSpec& base, const CalibrationResult& r,
                                    const std::string& host, const std::string& date);

// What both devices share: the fits and the measuring loop's checks.
namespace detail {

// Fits r.gemms: time = (F + h) / P over the FLOPs F, giving r.peak_flops (P), r.half_flops (h) and r.gemm_fit_error.
void fit_gemms(CalibrationResult& r);

// Repetitions for about `target_s` of timed work given one call's time (at least 3, at most `max_reps`).
int reps_for(double call_s, double target_s, int max_reps = 50);

// Throws dtrain::Error (exit 10, "interrupted; nothing was written") when stop() is true.
void check_stop(const std::function<bool()>& stop);

// The cost model's FLOP count of causal attention (layer_graph.cc): 2 b h s^2 d forward (the causal half), the
// backward kFlashBackwardFactor times that; per point, forward plus backward.
constexpr double kFlashBackwardFactor = 2.5;  // layer_graph.cc's backward_factor of a flash attention op
double attention_forward_flops(const AttentionPoint& p);
double attention_flops(const AttentionPoint& p);
// One pass's FLOPs at a point over its time, as a fraction of `peak_flops` (at most 4).
double attention_pass_efficiency(const AttentionPoint& p, double peak_flops, bool backward);

}  // namespace detail

}  // namespace dtrain::calibrate
