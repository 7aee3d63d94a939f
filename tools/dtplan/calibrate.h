// dtplan calibrate (CPU): measures dtrain's own CPU kernels on this machine, as the ranks of a job would run them, and
// fits the figures of the cost model (docs/cost-model.md, "Calibrating a machine").
//
// What runs: `ranks` worker threads at once, each with its own buffers, each the kernels a rank of that many per node
// would run, with the thread count dtexec gives a rank (cores / ranks, at least 1). So the figures are per rank and
// include the sharing of cores and memory bandwidth between the ranks of a node (exact when each rank has one thread,
// the usual case of several CPU ranks on one machine; with more, OpenBLAS's one process-wide pool is shared by the
// workers, which ranks in separate processes would not do).
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
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtrain/topology/cluster_spec.h"

namespace dtrain::dtplan {

struct CalibrateOptions {
  int ranks = 1;       // ranks per node measured together
  bool quick = false;  // fewer shapes and repetitions (about a quarter of the time)
  double budget_s = 60;
};

struct GemmPoint {
  std::int64_t m = 0, n = 0, k = 0;
  double seconds = 0;  // median per call, per rank
};

struct AttentionPoint {
  std::int64_t seq = 0;
  double forward_s = 0, backward_s = 0;
};

struct CollectivePoint {
  std::int64_t bytes = 0;
  double seconds = 0;  // median all-reduce time
};

struct CalibrationResult {
  int ranks = 1;
  int threads_per_rank = 1;
  std::vector<GemmPoint> gemms;
  double peak_flops = 0;      // fitted P
  double half_flops = 0;      // fitted h
  double gemm_fit_error = 0;  // mean relative error of the fit over the shapes
  double memory_bytes_per_s = 0;
  std::vector<AttentionPoint> attention;
  double attention_efficiency = 0;
  // All-reduce over Gloo between the `ranks` (loopback TCP, as CPU ranks of one node communicate); empty for one rank.
  std::vector<CollectivePoint> all_reduce;
  double bus_bytes_per_s = 0;           // the ring's bus bandwidth at the largest size
  double latency_s = 0;                 // per ring step, from the smallest size
  std::vector<double> comm_efficiency;  // per all_reduce point: the cost model's efficiency curve
  double seconds = 0;                   // the run's duration
};

// Measures and fits; `progress` gets one line per part. Stops early (throwing dtrain::Error, exit 10) when `stop()`
// turns true between measurements.
CalibrationResult calibrate_cpu(const CalibrateOptions& options,
                                const std::function<void(const std::string&)>& progress,
                                const std::function<bool()>& stop);

// The cluster description with the measured figures in place of the base's: [gpu] tflops_fp32 and hbm_gbps, the
// [calibration] constants, `ranks` GPUs (ranks) per node; and a [provenance] table (host, device, date, version,
// duration) that loads wherever a cluster.toml does.
std::string calibrated_cluster_toml(const topology::ClusterSpec& base, const CalibrationResult& r,
                                    const std::string& host, const std::string& date);

}  // namespace dtrain::dtplan
