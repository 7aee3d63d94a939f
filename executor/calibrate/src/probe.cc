// The executor probe of calibration (dtrain/calibrate/calibrate.h): a short training run of dtexec on the calibrated
// device, compared instruction by instruction with the simulator's timeline of the same plan (dtrain/ir/compare.h).
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>
#include <utility>

#include "dtrain/calibrate/calibrate.h"
#include "dtrain/common/error.h"
#include "dtrain/common/files.h"
#include "dtrain/common/stats.h"
#include "dtrain/common/strings.h"
#include "dtrain/common/toml_reader.h"
#include "dtrain/ir/compare.h"
#include "dtrain/ir/lower.h"
#include "dtrain/ir/simulate.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/plan/plan_file.h"

extern char** environ;

namespace dtrain::calibrate {

using namespace detail;

namespace {

namespace fs = std::filesystem;

// The probe's model: two Llama layers, large enough that the device, not the host, sets the pace, small enough to run
// in seconds. On a GPU its layer is a large model's (hidden 3072, 24 heads of 128 over 8 kv heads, 4096-token
// sequences: the kernels run for milliseconds, so the host's launches hide behind them as they do in real training);
// on a CPU a small one. Micro-batches of one sequence (two on a GPU, four on a CPU), so the gaps between instructions
// are seen several times per step; on a CPU the tensor-parallel runs also take all four sequences as one micro-batch.
// `small` on a GPU: the CPU's small layer in bf16, whose kernels finish faster than the host issues them (the host's
// floor per op), in eight micro-batches. `layers`: more than two for a pipeline over more than two ranks.
std::string probe_model_text(const std::string& device, bool small = false, int layers = 2) {
  const bool big = device == "cuda" && !small;
  return fmt::format(R"(format = 1
[model]
name = "{}"
arch = "llama"
layers = {}
hidden = {}
ffn_hidden = {}
heads = {}
kv_heads = {}
vocab = {}
seq_len = {}
[training]
global_batch = {}
dtype = "{}"
optimizer = "adamw"
lr = 1e-4
)",
                     small         ? "calibrate-probe-small"
                     : layers == 2 ? "calibrate-probe"
                                   : fmt::format("calibrate-probe-{}-layers", layers),
                     layers, big ? 3072 : 256, big ? 8192 : 768, big ? 24 : 8, big ? 8 : 4, big ? 32000 : 256,
                     big ? 4096 : 256,
                     small              ? 8
                     : device == "cuda" ? 2
                                        : 4,
                     device == "cuda" ? "bf16" : "fp32");
}

// Starts `args` with stdout and stderr into `log`.
pid_t spawn_logged(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // The probe is a job of its own: none of the rank contract of a job dtplan may itself run in (under srun or
  // dtlaunch), nor test hooks, reaches it. Kernel settings (DTRAIN_CUDA_*, DTRAIN_ATTENTION_KERNEL) do.
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    bool job = false;
    for (std::string_view prefix :
         {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=", "MASTER_ADDR=", "MASTER_PORT=",
          "DTRAIN_JOB_ID=", "DTRAIN_RESTART=", "DTRAIN_RUN_ID=", "DTRAIN_STORE", "DTRAIN_COMM_HOST=", "DTRAIN_PLAN=",
          "DTRAIN_PLUGIN_ERROR=", "DTRAIN_HEARTBEAT", "DTRAIN_TOPOLOGY", "DTRAIN_TEST_"}) {
      job = job || v.starts_with(prefix);
    }
    if (!job) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error(ErrorCategory::kIo, fmt::format("cannot start {}: {}", args[0], std::strerror(rc)));
  return pid;
}

// Waits for every process; the exit status of each (128 + signal when killed). When stop() turns true, stops them
// all (SIGTERM, then SIGKILL) and throws the interruption.
std::vector<int> wait_all(const std::vector<pid_t>& pids, const std::function<bool()>& stop) {
  std::vector<int> status(pids.size(), 0);
  std::vector<bool> done(pids.size(), false);
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (!done[i] && ::waitpid(pids[i], &status[i], WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
      }
    }
    if (left > 0 && stop && stop()) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) ::kill(pids[i], SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], &status[i], 0);
      }
      check_stop(stop);
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<int> rc;
  rc.reserve(status.size());
  for (int st : status) rc.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  return rc;
}

// The time per step of the passes of `rows` (compare's kinds): forward, backward, or both.
enum class Pass { kForward, kBackward, kBoth };
double kind_seconds(const std::vector<ir::Comparison::Row>& rows, bool measured, Pass pass = Pass::kBoth) {
  double s = 0;
  for (const auto& r : rows) {
    const bool forward = r.key == "forward";
    const bool backward = r.key == "backward" || r.key == "backward_input" || r.key == "backward_weight";
    if ((forward && pass != Pass::kBackward) || (backward && pass != Pass::kForward)) {
      s += measured ? r.measured_s : r.predicted_s;
    }
  }
  return s;
}

// The end of a log, for a message.
std::string log_tail(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > 2000) text = "..." + text.substr(text.size() - 2000);
  return std::string(trim(text));
}

// A scratch directory removed when it goes.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "dtplan-calibrate-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error(ErrorCategory::kIo, fmt::format("cannot create a directory under {}: {}",
                                                  fs::temp_directory_path().string(), std::strerror(errno)));
    }
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace

namespace {

// One probe run: the plan of `config` for `ranks` ranks on one node of `measured`, trained for `steps` steps by dtexec
// (under dtlaunch --nproc for more than one rank), its measured trace and step times.
struct ProbeRun {
  plan::Plan plan;
  std::vector<ir::Program> programs;  // the plan's, lowered once: re-pricing the plan does not change them
  std::vector<ir::MeasuredTrace> traces;
  std::vector<double> step_s;  // after the first step
};

// With `copies` > 1 that many independent copies of a one-rank run train at once, as the calibration's ranks shared
// the cores; the first one's trace counts.
ProbeRun run_probe(const fs::path& bin, const fs::path& dir, const model::ModelDescription& model,
                   const std::string& model_path, const topology::ClusterSpec& measured, plan::ParallelConfig config,
                   int ranks, const CalibrationResult& r, const std::function<void(const std::string&)>& progress,
                   const std::function<bool()>& stop, int copies = 1, int steps = 8) {
  const std::string tag = fmt::format("{}-tp{}dp{}mb{}{}", model.model.name, config.tp, config.dp, config.micro_batch,
                                      config.sequence_parallel ? "sp" : "");
  const std::string plan_path = (dir / (tag + "-plan.toml")).string();
  const std::string trace_path = (dir / (tag + "-trace.json")).string();
  const std::string metrics_path = (dir / (tag + "-metrics.jsonl")).string();
  const std::string log_path = (dir / (tag + ".log")).string();
  topology::ClusterSpec node = measured;
  node.nodes = 1;
  node.node.gpus = ranks;
  node.node.nvlink_domain = ranks;
  config.num_microbatches = static_cast<int>(model.training.global_batch) / (config.dp * config.micro_batch);
  ProbeRun run;
  run.plan = ir::plan_for_layout(model, node, config, model.training.global_batch);
  run.programs = ir::lower_all(run.plan);
  write_file_whole(plan_path, plan::render_plan(run.plan));
  std::vector<std::string> args;
  if (ranks > 1) args = {(bin / "dtlaunch").string(), "--nproc", std::to_string(ranks), "--"};
  args.insert(args.end(), {(bin / "dtexec").string(), "train", "--model", model_path, "--plan", plan_path, "--device",
                           r.device, "--data", "synthetic", "--steps", std::to_string(steps), "--trace", trace_path,
                           "--metrics", metrics_path});
  if (r.device == "cpu") args.insert(args.end(), {"--threads", std::to_string(r.threads_per_rank)});
  progress(fmt::format("executor probe: dtexec trains a {}-layer model for {} steps ({}{}{})", model.model.layers,
                       steps, run.plan.config.summary(),
                       ranks > 1 ? fmt::format(", {} ranks under dtlaunch", ranks) : "",
                       copies > 1 ? fmt::format(", {} copies at once", copies) : ""));
  // Copy k's files: the first copy's as named, the others' with ".copyK".
  auto of_copy = [](const std::string& path, std::size_t k) {
    return k == 0 ? path : fmt::format("{}.copy{}", path, k);
  };
  std::vector<pid_t> pids;
  for (std::size_t k = 0; k < static_cast<std::size_t>(std::max(copies, 1)); ++k) {
    std::vector<std::string> copy = args;
    for (auto& a : copy) {
      if (a == trace_path || a == metrics_path) a = of_copy(a, k);
    }
    pids.push_back(spawn_logged(copy, of_copy(log_path, k)));
  }
  const std::vector<int> rcs = wait_all(pids, stop);
  for (std::size_t k = 0; k < rcs.size(); ++k) {
    if (rcs[k] == 0) continue;
    throw Error(ErrorCategory::kInternal,
                fmt::format("dtplan calibrate: the executor probe ({}) failed with exit {}: {}",
                            run.plan.config.summary(), rcs[k], log_tail(of_copy(log_path, k))));
  }
  run.traces.push_back(ir::read_measured_trace(trace_path));
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) run.step_s.push_back(nlohmann::json::parse(line).at("step_s").get<double>());
  }
  if (run.step_s.size() > 2) run.step_s.erase(run.step_s.begin());  // the first step: warm-up
  return run;
}

// The run's measured timeline against the simulator's for `priced`: its plan, perhaps with other cluster figures.
ir::Comparison compared(const plan::Plan& priced, const ProbeRun& run) {
  return ir::compare(priced, ir::simulate(priced, run.programs), run.traces);
}

// A probe run with its measured timeline against the simulated one.
using ComparedRun = std::pair<ProbeRun, ir::Comparison>;
ComparedRun with_comparison(ProbeRun run) {
  ir::Comparison c = compared(run.plan, run);
  return {std::move(run), std::move(c)};
}

// Two runs of `start()`, the one faster by `seconds` counting: a slow period of the VM slows a run, never speeds it up.
// `report(first, second)` shows both.
ComparedRun faster_of_two(const std::function<ProbeRun()>& start,
                          const std::function<double(const ir::Comparison&)>& seconds,
                          const std::function<void(double, double)>& report) {
  ComparedRun first = with_comparison(start());
  ComparedRun second = with_comparison(start());
  report(seconds(first.second), seconds(second.second));
  return seconds(second.second) < seconds(first.second) ? std::move(second) : std::move(first);
}

// The forward and backward passes per step of `priced`'s timeline and of the measured one: (predicted, measured).
std::pair<double, double> passes(const plan::Plan& priced, const ProbeRun& run) {
  const ir::Comparison c = compared(priced, run);
  return {kind_seconds(c.by_kind, false), kind_seconds(c.by_kind, true)};
}

// How much the run's predicted passes grow per unit of a figure: `raise` adds 1000 units of it to a copy of the plan.
double passes_per_unit(const ProbeRun& run, double expected, const std::function<void(plan::Plan&)>& raise) {
  plan::Plan raised = run.plan;
  raise(raised);
  return (passes(raised, run).first - expected) / 1000;
}

// The value of a figure (`set` writes it into a plan) whose simulated step is `as_run`'s measured one, the passes
// priced with `reclaim`: the step is linear in a transfer's cost (a line through two prices). None where the figure
// does not move the step.
std::optional<double> fit_to_step(const ProbeRun& run, const ir::Comparison& as_run, double reclaim, double from,
                                  const std::function<void(plan::Plan&, double)>& set) {
  plan::Plan priced = run.plan;
  priced.cluster.node.gpu.calibration.idle_core_reclaim = reclaim;
  set(priced, from);
  const double step0 = compared(priced, run).predicted_step_s;
  set(priced, from + 1000);
  const double per_us = (compared(priced, run).predicted_step_s - step0) / 1000;
  if (per_us <= 0) return std::nullopt;
  return std::clamp(from + (as_run.measured_step_s - step0) / per_us, 0.0, 1e5);
}

// A GPU's second probe: a small model's layers, whose kernels finish faster than the host issues them, so that each
// pass takes what the host needs per op (its work to issue the op's kernels and their launches). The simulator, with
// floors of 1 and 2 ms per op far above any kernel of this model, counts the ops of the passes; the measured passes
// over those counts are the floors.
void probe_host_floor(const fs::path& bin, const fs::path& dir, const topology::ClusterSpec& measured,
                      const CalibrationResult& r, const std::function<void(const std::string&)>& progress,
                      const std::function<bool()>& stop, ProbeFigures& f) {
  const std::string path = (dir / "probe-small.toml").string();
  const std::string text = probe_model_text(r.device, true);
  write_file_whole(path, text);
  const model::ModelDescription small = model::parse_model(TomlDocument::parse_string(text, path));
  // Its steps take milliseconds: many of them, for a steady median.
  const ProbeRun run =
      run_probe(bin, dir, small, path, measured, plan::ParallelConfig{}, 1, r, progress, stop, 1, r.quick ? 8 : 40);
  auto at_floor = [&](double us) {
    plan::Plan priced = run.plan;
    priced.cluster.node.gpu.calibration.host_op_forward_us = us;
    priced.cluster.node.gpu.calibration.host_op_backward_us = us;
    return compared(priced, run);
  };
  const ir::Comparison one = at_floor(1000), two = at_floor(2000);
  // Ops per step, each pass: what 1 ms more per op adds, in ms.
  const double forward_ops =
      (kind_seconds(two.by_kind, false, Pass::kForward) - kind_seconds(one.by_kind, false, Pass::kForward)) / 1e-3;
  const double backward_ops =
      (kind_seconds(two.by_kind, false, Pass::kBackward) - kind_seconds(one.by_kind, false, Pass::kBackward)) / 1e-3;
  if (forward_ops < 1 || backward_ops < 1) return;  // nothing to divide by (cannot happen with a model's layers)
  const double forward = kind_seconds(one.by_kind, true, Pass::kForward);
  const double backward = kind_seconds(one.by_kind, true, Pass::kBackward);
  f.host_op_forward_us = 1e6 * forward / forward_ops;
  f.host_op_backward_us = 1e6 * backward / backward_ops;
  progress(fmt::format(
      "executor probe, a small model: forward {} over {:.0f} ops, backward {} over {:.0f} ops per step: the host's "
      "floor is {:.1f} us per forward op and {:.1f} us per backward op",
      format_seconds(forward), forward_ops, format_seconds(backward), backward_ops, *f.host_op_forward_us,
      *f.host_op_backward_us));
}

}  // namespace

std::optional<ProbeFigures> probe_executor(const topology::ClusterSpec& measured, const CalibrationResult& r,
                                           const std::function<void(const std::string&)>& progress,
                                           const std::function<bool()>& stop) {
  std::error_code ec;
  const fs::path bin = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec || !fs::exists(bin / "dtexec")) {
    progress(fmt::format("no dtexec beside this dtplan ({}): the overheads stay the base cluster's",
                         (bin / "dtexec").string()));
    return std::nullopt;
  }
  check_stop(stop);
  const TempDir dir;
  const std::string model_path = (dir.path / "probe.toml").string();
  const std::string model_text = probe_model_text(r.device);
  write_file_whole(model_path, model_text);
  const model::ModelDescription model = model::parse_model(TomlDocument::parse_string(model_text, model_path));

  // One rank (on CPUs as many copies at once as the calibration had ranks, sharing the cores as they did): the
  // bandwidth of the executor's memory-bound work and the overheads.
  plan::ParallelConfig single;
  const int copies = r.device == "cpu" ? r.ranks : 1;
  // On CPUs two runs, the faster passes counting: a slow period of the VM slows a run, never speeds it up, and the fit
  // below lays all of a slowdown on the memory-bound work (one run each, of one session's one-rank calibrations one
  // of four made by hand fitted 0.12 of the bandwidth where the others fitted 0.29-0.33, and two of the benchmark's
  // four priced small-llama 20% slow).
  // --quick: one. Several copies at once: 16 steps a run (the 4-rank calibration within its 60 s).
  const int probe_steps = r.quick ? 8 : copies > 1 ? 16 : 24;
  auto start_single = [&] {
    return run_probe(bin, dir.path, model, model_path, measured, single, 1, r, progress, stop, copies, probe_steps);
  };
  auto measured_passes_of = [](const ir::Comparison& c) { return kind_seconds(c.by_kind, true); };
  auto report_passes = [&](double first, double second) {
    progress(fmt::format("executor probe: passes of {} and {} per step; the faster run counts", format_seconds(first),
                         format_seconds(second)));
  };
  const auto [one, a] = r.device == "cpu" && !r.quick ? faster_of_two(start_single, measured_passes_of, report_passes)
                                                      : with_comparison(start_single());
  // The same plan priced with twice the memory bandwidth: what moves is the memory-bound time, halved.
  plan::Plan doubled = one.plan;
  doubled.cluster.node.gpu.calibration.hbm_efficiency *= 2;
  const double predicted = kind_seconds(a.by_kind, false);
  const double memory_bound = 2 * (predicted - passes(doubled, one).first);
  const double compute_bound = predicted - memory_bound;
  const double measured_passes = kind_seconds(a.by_kind, true);
  const auto& cal = measured.calibration();
  ProbeFigures f;
  f.step_s = median(one.step_s);
  f.span_s = a.measured_step_s;
  f.predicted_passes_s = predicted;
  f.measured_passes_s = measured_passes;
  // What the passes took beyond the GEMMs and attention is the memory-bound work: the bandwidth that explains it. On a
  // CPU, passes faster than the GEMMs and attention at the measured rate with the memory-bound work at full bandwidth
  // mean the kernels ran faster in training than alone (4 ranks on 2 cores: the probe at 259 ms against 316 ms
  // predicted in one calibration of five): the GEMM peak rises to explain them, the bandwidth stays whole.
  const double memory_at_full = memory_bound * cal.hbm_efficiency;
  if (r.device == "cpu" && compute_bound > 0 && measured_passes < compute_bound + memory_at_full) {
    f.hbm_efficiency = 1.0;
    f.compute_speedup = compute_bound / std::max(measured_passes - memory_at_full, 0.5 * compute_bound);
  } else {
    f.hbm_efficiency =
        memory_bound > 0 && measured_passes > compute_bound
            ? std::clamp(cal.hbm_efficiency * memory_bound / (measured_passes - compute_bound), 0.02, 1.0)
            : cal.hbm_efficiency;
  }
  const double busy = a.by_stage.empty() ? measured_passes : a.by_stage.front().measured_s;
  f.microbatch_overhead_s =
      std::max(0.0, (a.measured_step_s - busy) / static_cast<double>(one.plan.config.num_microbatches));
  f.step_overhead_s = std::max(0.0, f.step_s - a.measured_step_s);
  progress(fmt::format(
      "executor probe: step {} (instructions span {}), passes {} measured against {} predicted: memory-bound work at "
      "{:.0f}% of the bandwidth{}; {} per micro-batch between instructions, {} per step outside them",
      format_seconds(f.step_s), format_seconds(f.span_s), format_seconds(measured_passes), format_seconds(predicted),
      100 * f.hbm_efficiency,
      f.compute_speedup != 1 ? fmt::format(", the GEMM peak x{:.3f}", f.compute_speedup) : std::string(),
      format_seconds(f.microbatch_overhead_s), format_seconds(f.step_overhead_s)));

  if (r.device == "cuda") probe_host_floor(bin, dir.path, measured, r, progress, stop, f);

  // The cluster with the figures fitted so far, which the later runs are priced with.
  topology::ClusterSpec fitted = measured;
  apply_probe(fitted, f);

  // Several CPU ranks per node: first data parallelism over all of them. Its gradients' all-reduce after the backward
  // pass (6.8 MB of the probe's, which the ranks reach unevenly on shared cores) sets the bandwidth of a collective
  // between the ranks ([node] nvlink_gbps) in place of the all-reduce microbenchmark's, run alone (with it small-llama
  // dp4 came out 9-11% fast: its gradients' reduce-scatter measured 12-17 ms against 10 ms). Not with --quick (its
  // 15 s).
  if (r.device == "cpu" && r.ranks > 1 && !r.quick && fs::exists(bin / "dtlaunch") &&
      model.training.global_batch % r.ranks == 0) {
    plan::ParallelConfig data;
    data.dp = r.ranks;
    const ProbeRun run = run_probe(bin, dir.path, model, model_path, fitted, data, r.ranks, r, progress, stop, 1, 12);
    // The gradients' collectives per step at a bandwidth: (predicted, measured).
    auto dp_seconds = [&](double gbps) {
      plan::Plan priced = run.plan;
      priced.cluster.node.nvlink_gbps = gbps;
      for (const auto& row : compared(priced, run).by_kind) {
        if (row.key == "dp") return std::make_pair(row.predicted_s, row.measured_s);
      }
      return std::make_pair(0.0, 0.0);
    };
    // The predicted time is a fixed part and the bytes over the bandwidth: halving the bandwidth adds the second.
    const double gbps = fitted.node.nvlink_gbps;
    const auto [at_gbps, measured_dp] = dp_seconds(gbps);
    const double bytes_part = dp_seconds(gbps / 2).first - at_gbps, fixed = at_gbps - bytes_part;
    if (bytes_part > 0 && measured_dp > fixed) {
      f.nvlink_gbps = std::clamp(gbps * bytes_part / (measured_dp - fixed), gbps / 4, gbps * 4);
      f.dp_collectives_s = measured_dp;
      fitted.node.nvlink_gbps = *f.nvlink_gbps;
      progress(
          fmt::format("executor probe, dp={}: the gradients' collectives took {} per step against {} predicted at the "
                      "all-reduce's {:.2f} GB/s: {:.2f} GB/s between the ranks",
                      r.ranks, format_seconds(measured_dp), format_seconds(at_gbps), gbps, *f.nvlink_gbps));
    }
  }

  // Then tensor parallelism over all of them, whose collectives sit inside the passes. What the
  // passes take beyond the one-rank figures' prediction is what a collective between the ranks really costs, waits for
  // the slowest rank and the ranks' sharing of the cores included. A collective's time is a fixed cost per collective
  // (collective_sync_us: on ranks that share cores, the wait for the others to run), a latency per ring step
  // (nvlink_latency_us) and the bytes over the bandwidth (the data-parallel run's where it ran). Three runs separate
  // the first two: collectives of one sequence and of four (the same bytes in a quarter of the collectives), and of one
  // sequence with sequence parallelism (twice the collectives, all-gathers and reduce-scatters of half the ring steps
  // each: the same steps and bytes).
  const int tp = r.ranks;
  if (r.device == "cpu" && tp > 1 && !fs::exists(bin / "dtlaunch")) {
    progress(fmt::format("no dtlaunch beside this dtplan ({}): the links between ranks stay the all-reduce's",
                         (bin / "dtlaunch").string()));
  } else if (r.device == "cpu" && tp > 1 && model.model.heads % tp == 0 && model.model.kv_heads % tp == 0) {
    // Per run: the measured passes less the predicted ones, and how the prediction moves per unit of each figure: a
    // microsecond more per collective, a microsecond more per ring step.
    std::vector<double> gap;
    std::vector<std::vector<double>> slopes;
    std::vector<std::pair<double, double>> shown;  // (measured, predicted) per run, for the progress line
    struct Layout {
      int micro_batch;
      bool sp;
    };
    const std::vector<Layout> layouts{{1, false}, {static_cast<int>(model.training.global_batch), false}, {1, true}};
    for (const auto& [micro_batch, sp] : layouts) {
      plan::ParallelConfig sharded;
      sharded.tp = tp;
      sharded.micro_batch = micro_batch;
      sharded.sequence_parallel = sp;
      // 20 steps: with 8, three calibrations of one machine fitted 480 to 2330 us per collective. --quick: 5 (its three
      // runs in 15 s with 4 ranks on 2 cores).
      const ProbeRun run =
          run_probe(bin, dir.path, model, model_path, fitted, sharded, tp, r, progress, stop, 1, r.quick ? 5 : 20);
      const auto [expected, measured_s] = passes(run.plan, run);
      gap.push_back(measured_s - expected);
      slopes.push_back(
          {passes_per_unit(run, expected, [](plan::Plan& p) { p.cluster.network.collective_sync_us += 1000; }),
           passes_per_unit(run, expected, [](plan::Plan& p) { p.cluster.network.nvlink_latency_us += 1000; })});
      shown.emplace_back(measured_s, expected);
    }
    // Each figure's change, at least 0 each: the least-squares fit over the runs with both free, or, where that
    // leaves a bound, with one held at 0 or at the all-reduce's value. The bandwidth stays the all-reduce's alone:
    // fitted as a third figure, it moved between 0.29 and 1.35 GB/s in five 4-rank calibrations (the runs' messages
    // are small), and the data-parallel gradients' all-reduce, all bandwidth, was priced up to 15% off with it.
    const std::vector<double> current{fitted.network.collective_sync_us, fitted.network.nvlink_latency_us};
    const std::vector<double> change = bounded_fit(slopes, gap, current, {0, 0});
    f.collective_sync_us = std::clamp(current[0] + change[0], 0.0, 1e5);
    f.nvlink_latency_us = std::max(0.0, current[1] + change[1]);
    std::vector<std::string> runs;
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      runs.push_back(fmt::format("{} against {} ({} of {}{})", format_seconds(shown[i].first),
                                 format_seconds(shown[i].second), layouts[i].micro_batch == 1 ? "1 sequence" : "all",
                                 tp, layouts[i].sp ? ", sequence parallel" : ""));
    }
    progress(fmt::format(
        "executor probe, tensor parallel: passes measured {}: {:.0f} us per collective, {:.0f} us per ring step (the "
        "all-reduce alone: {:.0f} us per ring step; its {:.2f} GB/s kept)",
        join(runs, ", "), *f.collective_sync_us, *f.nvlink_latency_us, fitted.network.nvlink_latency_us,
        fitted.node.nvlink_gbps));
    fitted.network.collective_sync_us = *f.collective_sync_us;
    fitted.network.nvlink_latency_us = *f.nvlink_latency_us;

    // With four ranks and more, groups of two (dp = ranks / 2): several groups at once on the shared cores, which
    // drift apart between the dp all-reduces, so that a member a collective waits for may be off its core while
    // another group's rank holds it. What such a collective costs beyond the figures above, per collective, from one
    // more run ([network] subgroup_sync_us; 4 ranks on 2 cores: small-llama dp2 tp2 came out 13% fast without it).
    if (tp >= 4 && tp % 2 == 0 && !r.quick) {  // --quick: not in its 15 s
      plan::ParallelConfig pairs;
      pairs.tp = 2;
      pairs.dp = tp / 2;
      const ProbeRun run = run_probe(bin, dir.path, model, model_path, fitted, pairs, tp, r, progress, stop, 1, 20);
      const auto [expected, measured_s] = passes(run.plan, run);
      const double per_us =
          passes_per_unit(run, expected, [](plan::Plan& p) { p.cluster.network.subgroup_sync_us += 1000; });
      f.subgroup_sync_us = per_us > 0 ? std::clamp((measured_s - expected) / per_us, 0.0, 1e5) : 0.0;
      fitted.network.subgroup_sync_us = *f.subgroup_sync_us;
      progress(
          fmt::format("executor probe, groups of 2: passes {} measured against {} predicted: {:.0f} us more per "
                      "collective of a group smaller than the node's ranks",
                      format_seconds(measured_s), format_seconds(expected), *f.subgroup_sync_us));
    }
  }

  // More CPU ranks than cores: a pipeline's ranks wait in its fill and drain, and the busy ones run on the cores they
  // leave, though not on all of them (the scheduler moves work late). Pipeline runs fit three figures:
  //   - [calibration] idle_core_reclaim, the fraction of the waiting ranks' share that the busy ones take up, to the
  //     first stage's compute busy time in a run with two stages (dp = ranks / 2: its passes run faster while the
  //     other stage waits). Fitted to the step it came out anywhere between 0 and 0.5 in eight calibrations: the
  //     step also holds the waits.
  //   - [network] p2p_latency_us, to the step of one pipeline over all the ranks (pp = ranks, a model of as many
  //     layers): what the step takes beyond the passes is the pipeline's waits. A transfer between stages is a
  //     meeting of two ranks, each of which the other may find off its core, far more than the base's latency
  //     between idle processes.
  //   - [network] p2p_pipelines_us, to the step of the first run: with several pipelines on the cores a transfer's
  //     partner is off its core more often, running another pipeline's pass. One figure for both cost 25% on
  //     small-llama pp 4 in two of three benchmark runs: fitted to the two-stage run alone, it came out 3 to 7 ms
  //     per transfer; one pipeline of four stages meets in about 1 ms.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (r.device == "cpu" && !r.quick && r.ranks > cores && r.ranks % 2 == 0 && model.model.layers % 2 == 0 &&
      fs::exists(bin / "dtlaunch")) {
    fitted.node.cores = cores;
    // Two runs, the faster counting: a slow period of the VM makes a run slower, never faster, and what the step
    // holds beyond the passes goes into the transfers' latency (from one run of 24 steps it came out at 3.5 to 7.4
    // ms in four calibrations).
    auto faster_pipeline = [&](const model::ModelDescription& m, const std::string& path, const plan::ParallelConfig& c,
                               int steps) {
      return faster_of_two(
          [&] { return run_probe(bin, dir.path, m, path, fitted, c, r.ranks, r, progress, stop, 1, steps); },
          [](const ir::Comparison& x) { return x.measured_step_s; },
          [&](double first, double second) {
            progress(fmt::format("executor probe, pp={} dp={}: steps of {} and {}; the faster run counts", c.pp, c.dp,
                                 format_seconds(first), format_seconds(second)));
          });
    };
    plan::ParallelConfig piped;
    piped.pp = 2;
    piped.dp = r.ranks / 2;
    auto piped_run = faster_pipeline(model, model_path, piped, 20);  // not a structured binding: the lambdas use it
    const ProbeRun& run = piped_run.first;
    const ir::Comparison& as_run = piped_run.second;
    auto first_stage_busy = [](const ir::Comparison& c, bool as_measured) {
      if (c.by_stage.empty()) return 0.0;
      return as_measured ? c.by_stage.front().measured_s : c.by_stage.front().predicted_s;
    };
    auto predicted_busy = [&](double reclaim) {
      plan::Plan priced = run.plan;
      priced.cluster.node.gpu.calibration.idle_core_reclaim = reclaim;
      return first_stage_busy(compared(priced, run), false);
    };
    const double measured_busy = first_stage_busy(as_run, true);
    const double none_taken = predicted_busy(0), all_taken = predicted_busy(1);
    double low = 0, high = 1;  // the predicted busy time falls as the reclaimed share grows
    if (measured_busy >= none_taken) {
      high = 0;
    } else if (measured_busy <= all_taken) {
      low = 1;
    } else {
      for (int i = 0; i < 20; ++i) {
        const double mid = 0.5 * (low + high);
        (predicted_busy(mid) > measured_busy ? low : high) = mid;
      }
    }
    f.cores = cores;
    f.idle_core_reclaim = 0.5 * (low + high);
    const double reclaim = *f.idle_core_reclaim;
    progress(fmt::format(
        "executor probe, pp=2 dp={}: rank 0 computed for {} per step, against {} predicted with the waiting ranks' "
        "cores idle and {} with all of them taken up: the busy ranks take up {:.0f}% of them ({} cores)",
        piped.dp, format_seconds(measured_busy), format_seconds(none_taken), format_seconds(all_taken), 100 * reclaim,
        cores));

    // One pipeline over all the ranks: a model with a layer per rank, 12 steps per run (about 1 s of steps each).
    const std::string deep_path = (dir.path / "probe-deep.toml").string();
    const std::string deep_text = probe_model_text(r.device, false, r.ranks);
    write_file_whole(deep_path, deep_text);
    const model::ModelDescription deep_model = model::parse_model(TomlDocument::parse_string(deep_text, deep_path));
    plan::ParallelConfig whole;
    whole.pp = r.ranks;
    const auto [deep, deep_as_run] = faster_pipeline(deep_model, deep_path, whole, 12);
    const double base_us = fitted.network.p2p_latency_us;
    f.p2p_latency_us = fit_to_step(deep, deep_as_run, reclaim, base_us,
                                   [](plan::Plan& p, double us) { p.cluster.network.p2p_latency_us = us; });
    if (!f.p2p_latency_us) return f;
    fitted.network.p2p_latency_us = *f.p2p_latency_us;
    progress(fmt::format("executor probe, pp={}: step {}: {:.0f} us per transfer between stages (the base: {:.0f} us)",
                         whole.pp, format_seconds(deep_as_run.measured_step_s), *f.p2p_latency_us, base_us));
    // The two-stage run's pipelines: what their transfers cost more, per further pipeline.
    const double latency_us = *f.p2p_latency_us;
    f.p2p_pipelines_us = fit_to_step(run, as_run, reclaim, 0, [latency_us](plan::Plan& p, double us) {
      p.cluster.network.p2p_latency_us = latency_us;
      p.cluster.network.p2p_pipelines_us = us;
    });
    if (f.p2p_pipelines_us) {
      progress(fmt::format(
          "executor probe, pp=2 dp={}: step {}: {:.0f} us more per transfer for each further pipeline on the cores",
          piped.dp, format_seconds(as_run.measured_step_s), *f.p2p_pipelines_us));
    }
  }
  return f;
}

}  // namespace dtrain::calibrate
