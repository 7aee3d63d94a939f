// The executor probe of dtplan calibrate (calibrate.h): a short training run of dtexec on the calibrated device,
// compared instruction by instruction with the simulator's timeline of the same plan (dtrain/ir/compare.h).
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

#include "calibrate.h"
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

namespace dtrain::dtplan {

using namespace calibrate_detail;

namespace {

namespace fs = std::filesystem;

// The probe's model: two Llama layers, large enough that the device, not the host, sets the pace, small enough to run
// in seconds. On a GPU its layer is a large model's (hidden 3072, 24 heads of 128 over 8 kv heads, 4096-token
// sequences: the kernels run for milliseconds, so the host's launches hide behind them as they do in real training);
// on a CPU a small one. Two micro-batches of one sequence each, so the gaps between instructions are seen twice per
// step.
std::string probe_model_text(const std::string& device) {
  const bool gpu = device == "cuda";
  return fmt::format(R"(format = 1
[model]
name = "calibrate-probe"
arch = "llama"
layers = 2
hidden = {}
ffn_hidden = {}
heads = {}
kv_heads = {}
vocab = {}
seq_len = {}
[training]
global_batch = 2
dtype = "{}"
optimizer = "adamw"
lr = 1e-4
)",
                     gpu ? 3072 : 256, gpu ? 8192 : 768, gpu ? 24 : 8, gpu ? 8 : 4, gpu ? 32000 : 256, gpu ? 4096 : 256,
                     gpu ? "bf16" : "fp32");
}

// Runs argv with stdout and stderr into `log`; returns the exit status (128 + signal when killed). Stops the child
// (SIGTERM, then SIGKILL) and throws the interruption when stop() turns true.
int run_logged(const std::vector<std::string>& args, const std::string& log, const std::function<bool()>& stop) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error(ErrorCategory::kIo, fmt::format("cannot start {}: {}", args[0], std::strerror(rc)));
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (stop && stop()) {
      ::kill(pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      check_stop(stop);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

double kind_seconds(const std::vector<ir::Comparison::Row>& rows, bool measured) {
  double s = 0;
  for (const auto& r : rows) {
    if (r.key == "forward" || r.key == "backward" || r.key == "backward_input" || r.key == "backward_weight") {
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

std::optional<ProbeFigures> probe_executor(const topology::ClusterSpec& measured, const CalibrationResult& r,
                                           const std::function<void(const std::string&)>& progress,
                                           const std::function<bool()>& stop) {
  std::error_code ec;
  const fs::path dtexec = fs::read_symlink("/proc/self/exe", ec).parent_path() / "dtexec";
  if (ec || !fs::exists(dtexec)) {
    progress(fmt::format("no dtexec beside this dtplan ({}): the overheads stay the base cluster's", dtexec.string()));
    return std::nullopt;
  }
  check_stop(stop);
  const TempDir dir;
  const std::string model_path = (dir.path / "probe.toml").string();
  const std::string plan_path = (dir.path / "plan.toml").string();
  const std::string trace_path = (dir.path / "trace.json").string();
  const std::string metrics_path = (dir.path / "metrics.jsonl").string();
  const std::string log_path = (dir.path / "dtexec.log").string();
  const std::string model_text = probe_model_text(r.device);
  write_file_whole(model_path, model_text);
  const model::ModelDescription model = model::parse_model(TomlDocument::parse_string(model_text, model_path));
  topology::ClusterSpec one = measured;
  one.nodes = 1;
  one.node.gpus = 1;
  one.node.nvlink_domain = 1;
  plan::ParallelConfig config;
  config.micro_batch = 1;
  config.num_microbatches = static_cast<int>(model.training.global_batch);
  const plan::Plan plan = ir::plan_for_layout(model, one, config, model.training.global_batch);
  write_file_whole(plan_path, plan::render_plan(plan));

  const int steps = 8;
  std::vector<std::string> args{dtexec.string(), "train",    "--model",   model_path,  "--plan",  plan_path,
                                "--device",      r.device,   "--data",    "synthetic", "--steps", std::to_string(steps),
                                "--trace",       trace_path, "--metrics", metrics_path};
  if (r.device == "cpu") {
    args.push_back("--threads");
    args.push_back(std::to_string(r.threads_per_rank));
  }
  progress(fmt::format("executor probe: dtexec trains a 2-layer model for {} steps ({})", steps, config.summary()));
  const int rc = run_logged(args, log_path, stop);
  if (rc != 0) {
    throw Error(ErrorCategory::kInternal,
                fmt::format("dtplan calibrate: the executor probe (dtexec train) failed with exit {}: {}", rc,
                            log_tail(log_path)));
  }
  const std::vector<ir::MeasuredTrace> traces{ir::read_measured_trace(trace_path)};
  const std::vector<ir::Program> programs = ir::lower_all(plan);
  const ir::Comparison a = ir::compare(plan, ir::simulate(plan, programs), traces);
  // The same plan priced with twice the memory bandwidth: what moves is the memory-bound time, halved.
  plan::Plan doubled = plan;
  doubled.cluster.node.gpu.calibration.hbm_efficiency *= 2;
  const ir::Comparison b = ir::compare(doubled, ir::simulate(doubled, programs), traces);

  std::vector<double> step_s;
  {
    std::ifstream in(metrics_path);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) step_s.push_back(nlohmann::json::parse(line).at("step_s").get<double>());
    }
  }
  if (step_s.size() > 2) step_s.erase(step_s.begin());  // the first step: warm-up
  const double memory_bound = 2 * (kind_seconds(a.by_kind, false) - kind_seconds(b.by_kind, false));
  const double compute_bound = kind_seconds(a.by_kind, false) - memory_bound;
  const double passes = kind_seconds(a.by_kind, true);
  const auto& cal = measured.calibration();
  ProbeFigures f;
  f.step_s = median(step_s);
  f.span_s = a.measured_step_s;
  f.predicted_passes_s = kind_seconds(a.by_kind, false);
  f.measured_passes_s = passes;
  // What the passes took beyond the GEMMs and attention is the memory-bound work: the bandwidth that explains it.
  f.hbm_efficiency = memory_bound > 0 && passes > compute_bound
                         ? std::clamp(cal.hbm_efficiency * memory_bound / (passes - compute_bound), 0.02, 1.0)
                         : cal.hbm_efficiency;
  const double busy = a.by_stage.empty() ? passes : a.by_stage.front().measured_s;
  f.microbatch_overhead_s =
      std::max(0.0, (a.measured_step_s - busy) / static_cast<double>(plan.config.num_microbatches));
  f.step_overhead_s = std::max(0.0, f.step_s - a.measured_step_s);
  progress(fmt::format(
      "executor probe: step {} (instructions span {}), passes {} measured against {} predicted: memory-bound work at "
      "{:.0f}% of the bandwidth; {} per micro-batch between instructions, {} per step outside them",
      format_seconds(f.step_s), format_seconds(f.span_s), format_seconds(passes), format_seconds(f.predicted_passes_s),
      100 * f.hbm_efficiency, format_seconds(f.microbatch_overhead_s), format_seconds(f.step_overhead_s)));
  return f;
}

}  // namespace dtrain::dtplan
