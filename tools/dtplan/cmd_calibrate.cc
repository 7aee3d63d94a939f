// dtplan calibrate: measure this machine with dtrain's own kernels (CPU, or GPU with --device cuda) and write a
// cluster.toml with the figures (dtrain/calibrate/calibrate.h says what is measured and how it is fitted).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "commands.h"
#include "dtrain/calibrate/calibrate.h"
#include "dtrain/common/cli_count.h"
#include "dtrain/common/error.h"
#include "dtrain/common/files.h"
#include "dtrain/common/host.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain::dtplan {
namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted.store(true); }

// While alive, SIGINT and SIGTERM set g_interrupted (calibrate_cpu stops at its next measurement); the handlers before
// are put back when it goes, also when the measuring throws.
struct InterruptGuard {
  InterruptGuard() : old_int(std::signal(SIGINT, on_interrupt)), old_term(std::signal(SIGTERM, on_interrupt)) {}
  ~InterruptGuard() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  void (*old_int)(int);
  void (*old_term)(int);
};

struct CalibrateCommand {
  std::string device = "cpu";
  std::string base;
  std::string output;
  std::optional<int> ranks;  // a count (dtrain/common/count.h); absent: the base's GPUs per node
  bool quick = false;
  bool json = false;
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

void run_calibrate(const CalibrateCommand& o) {
  if (o.device != "cpu" && o.device != "cuda") {
    throw input_error(fmt::format("--device {}: expected cpu or cuda", o.device));
  }
  const bool gpu = o.device == "cuda";
  if (o.output.empty()) throw input_error("dtplan calibrate: -o cluster.toml is required");
  std::optional<topology::ClusterSpec> base;
  if (!o.base.empty()) {
    base = topology::load_cluster(o.base);
  } else if (!gpu) {
    base = calibrate::default_cpu_base();
  }
  calibrate::CalibrateOptions co;
  // A GPU calibration without --base measures one GPU per node unless told more.
  co.ranks = o.ranks ? *o.ranks : base ? base->node.gpus : 1;
  co.quick = o.quick;
  // A GPU's kernels take milliseconds: half the CPU's budget measures them as well.
  if (gpu) co.budget_s = 30;
  // The output's directory must exist before minutes of measuring.
  const fs::path out_dir = fs::path(o.output).parent_path();
  if (!out_dir.empty() && !fs::is_directory(out_dir)) {
    throw input_error(fmt::format("-o {}: the directory {} does not exist", o.output, out_dir.string()));
  }
  calibrate::CalibrationResult r;
  std::string text;
  {
    const auto t0 = std::chrono::steady_clock::now();
    const InterruptGuard interrupts;
    const auto progress = [&](const std::string& line) { std::cerr << "dtplan calibrate: " << line << '\n'; };
    const auto stop = [] { return g_interrupted.load(); };
    r = gpu ? calibrate::calibrate_cuda(co, progress, stop) : calibrate::calibrate_cpu(co, progress, stop);
    if (!base) base = calibrate::default_cuda_base(r);
    // The executor probe runs with the kernel figures just measured.
    r.probe = calibrate::probe_executor(calibrate::calibrated_cluster(*base, r), r, progress, stop);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    text = calibrate::calibrated_cluster_toml(*base, r, host_name(), utc_now());
  }
  // The result must load like any cluster.toml before it is put in place (whole or not at all).
  topology::parse_cluster(TomlDocument::parse_string(text, o.output));
  write_file_whole(o.output, text);
  if (o.json) {
    nlohmann::json j{{"output", o.output},
                     {"device", r.device},
                     {"device_name", r.device_name},
                     {"seconds", r.seconds},
                     {"ranks_per_node", r.ranks},
                     {"threads_per_rank", r.threads_per_rank},
                     {"gemm_peak_flops", r.peak_flops},
                     {"gemm_half_flops", r.half_flops},
                     {"gemm_fit_error", r.gemm_fit_error},
                     {"memory_bytes_per_s", r.memory_bytes_per_s},
                     {"attention_efficiency", r.attention_efficiency}};
    j["gemms"] = nlohmann::json::array();
    for (const auto& g : r.gemms) {
      j["gemms"].push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"pass", g.pass}, {"seconds", g.seconds}});
    }
    j["grouped_gemms"] = nlohmann::json::array();
    for (const auto& g : r.grouped_gemms) {
      j["grouped_gemms"].push_back(
          {{"groups", 8}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"pass", g.pass}, {"seconds", g.seconds}});
    }
    if (!r.grouped_gemms.empty()) j["expert_gemm_efficiency"] = r.expert_gemm_efficiency;
    j["attention"] = nlohmann::json::array();
    for (const auto& a : r.attention) {
      j["attention"].push_back({{"batch", a.batch},
                                {"seq", a.seq},
                                {"heads", a.heads},
                                {"kv_heads", a.kv_heads},
                                {"head_dim", a.head_dim},
                                {"forward_s", a.forward_s},
                                {"backward_s", a.backward_s}});
    }
    j["memory_ops"] = nlohmann::json::array();
    for (const auto& m : r.memory_ops) {
      j["memory_ops"].push_back({{"op", m.op}, {"bytes", m.bytes}, {"seconds", m.seconds}});
    }
    if (gpu) j["kernel_launch_s"] = r.launch_s;
    if (r.probe) {
      j["probe"] = {{"step_s", r.probe->step_s},
                    {"span_s", r.probe->span_s},
                    {"passes_predicted_s", r.probe->predicted_passes_s},
                    {"passes_measured_s", r.probe->measured_passes_s},
                    {"hbm_efficiency", r.probe->hbm_efficiency},
                    {"compute_speedup", r.probe->compute_speedup},
                    {"microbatch_overhead_s", r.probe->microbatch_overhead_s},
                    {"step_overhead_s", r.probe->step_overhead_s}};
      if (r.probe->nvlink_gbps) j["probe"]["nvlink_gbps"] = *r.probe->nvlink_gbps;
      if (r.probe->collective_sync_us) j["probe"]["collective_sync_us"] = *r.probe->collective_sync_us;
      if (r.probe->nvlink_latency_us) j["probe"]["nvlink_latency_us"] = *r.probe->nvlink_latency_us;
      if (r.probe->subgroup_sync_us) j["probe"]["subgroup_sync_us"] = *r.probe->subgroup_sync_us;
      if (r.probe->idle_core_reclaim) {
        j["probe"]["cores"] = r.probe->cores;
        j["probe"]["idle_core_reclaim"] = *r.probe->idle_core_reclaim;
      }
      if (r.probe->p2p_latency_us) j["probe"]["p2p_latency_us"] = *r.probe->p2p_latency_us;
      if (r.probe->p2p_pipelines_us) j["probe"]["p2p_pipelines_us"] = *r.probe->p2p_pipelines_us;
      if (r.probe->host_op_forward_us) j["probe"]["host_op_forward_us"] = *r.probe->host_op_forward_us;
      if (r.probe->host_op_backward_us) j["probe"]["host_op_backward_us"] = *r.probe->host_op_backward_us;
    }
    j["all_reduce"] = nlohmann::json::array();
    for (std::size_t i = 0; i < r.all_reduce.size(); ++i) {
      j["all_reduce"].push_back({{"bytes", r.all_reduce[i].bytes},
                                 {"seconds", r.all_reduce[i].seconds},
                                 {"efficiency", r.comm_efficiency[i]}});
    }
    j["all_reduce_bus_bytes_per_s"] = r.bus_bytes_per_s;
    j["all_reduce_latency_s"] = r.latency_s;
    std::cout << j.dump(2) << "\n";
    return;
  }
  if (gpu) {
    std::cout << fmt::format(
        "calibrated {} in {:.1f} s: GEMM peak {:.0f} TFLOP/s (half-size {:.3g} GFLOP, fit error {:.1f}%), "
        "memory-bound kernels {:.0f} GB/s, attention at {:.0f}% of the GEMM peak, kernel launch {}\n"
        "cluster written to {}\n",
        r.device_name, r.seconds, r.peak_flops / 1e12, r.half_flops / 1e9, 100 * r.gemm_fit_error,
        r.memory_bytes_per_s / 1e9, 100 * r.attention_efficiency, format_seconds(r.launch_s), o.output);
    return;
  }
  std::cout << fmt::format(
      "calibrated in {:.1f} s: GEMM peak {:.1f} GFLOP/s per rank (half-size {:.3g} GFLOP, fit error {:.1f}%), memory "
      "{:.2f} GB/s per rank, attention at {:.0f}% of the GEMM peak; {} rank(s) per node, {} thread(s) each\n"
      "cluster written to {}\n",
      r.seconds, r.peak_flops / 1e9, r.half_flops / 1e9, 100 * r.gemm_fit_error, r.memory_bytes_per_s / 1e9,
      100 * r.attention_efficiency, r.ranks, r.threads_per_rank, o.output);
}

void setup_calibrate(CLI::App& app) {
  auto o = std::make_shared<CalibrateCommand>();
  auto* sub = app.add_subcommand("calibrate", "Measure this machine with dtrain's kernels and write a cluster.toml");
  sub->add_option("--device", o->device, "cpu, or cuda (GPU 0, with dtrain's CUDA kernels)")->capture_default_str();
  sub->add_option("--base", o->base,
                  "Cluster whose other figures to keep (default: this machine as one node of CPU ranks; with --device "
                  "cuda, one node of this GPU from the catalog)");
  sub->add_option("-o,--output", o->output, "The cluster.toml to write")->required();
  sub->add_option("--ranks-per-node", o->ranks, "Ranks measured together (default: the base's GPUs per node)")
      ->check(CountValidator());
  sub->add_flag("--quick", o->quick,
                "Fewer shapes and repetitions (CPU: about 15 s instead of 60; GPU: 8 s instead of 30)");
  sub->add_flag("--json", o->json, "Print the measurements as JSON");
  sub->callback([o] { run_calibrate(*o); });
}

}  // namespace

DTPLAN_COMMAND(56, setup_calibrate);

}  // namespace dtrain::dtplan
