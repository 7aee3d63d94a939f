// dtplan calibrate on this machine: a quick run writes a cluster.toml that loads wherever one does, with its
// provenance shown by explain; an interrupted run and impossible requests leave nothing behind and exit with their
// codes. (How close the calibrated predictions come to measured steps is bench/calibrate_vs_measured.sh's question:
// timings are not asserted in tests.)
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <thread>

#include "shell.h"
#include "svg_check.h"

extern char** environ;

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using namespace dtrain::testing;

const std::string kRoot = DTRAIN_SOURCE_DIR;
const std::string kDtplan = std::string(DTRAIN_BINARY_DIR) + "/bin/dtplan";

using Result = ShellResult;

TEST(Calibrate, AQuickRunWritesAClusterThatPlansWithItsProvenance) {
  ScratchDir scratch;
  const fs::path& d = scratch.path();
  const std::string out = (d / "measured.toml").string();
  // Run as if inside another job's rank (srun, dtlaunch): its rank contract must not reach the probe's dtexec.
  Result r = shell(d, fmt::format("env WORLD_SIZE=4 RANK=3 LOCAL_WORLD_SIZE=4 DTRAIN_PLAN=/nonexistent.toml "
                                  "{} calibrate --quick --ranks-per-node 2 -o {} --json",
                                  kDtplan, out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ranks_per_node"], 2);
  EXPECT_GT(j["gemm_peak_flops"].get<double>(), 1e8) << "a CPU core does more than 0.1 GFLOP/s";
  EXPECT_GT(j["memory_bytes_per_s"].get<double>(), 1e8);
  EXPECT_GT(j["attention_efficiency"].get<double>(), 0);
  EXPECT_LE(j["attention_efficiency"].get<double>(), 1);
  EXPECT_EQ(j["gemms"].size(), 4u);
  ASSERT_EQ(j["all_reduce"].size(), 3u) << "two ranks: the all-reduce between them measured";
  EXPECT_GT(j["all_reduce_bus_bytes_per_s"].get<double>(), 0);
  for (const auto& p : j["all_reduce"]) {
    EXPECT_GT(p["efficiency"].get<double>(), 0) << p.dump();
    EXPECT_LE(p["efficiency"].get<double>(), 1) << p.dump();
  }
  // The executor probe ran dtexec (beside dtplan) and its figures are in the file.
  ASSERT_TRUE(j.contains("probe")) << r.err;
  const auto& probe = j["probe"];
  EXPECT_GT(probe["step_s"].get<double>(), 0) << probe.dump();
  EXPECT_GT(probe["passes_measured_s"].get<double>(), 0) << probe.dump();
  EXPECT_GE(probe["step_s"].get<double>(), probe["span_s"].get<double>()) << probe.dump();
  EXPECT_GT(probe["hbm_efficiency"].get<double>(), 0) << probe.dump();
  EXPECT_LE(probe["hbm_efficiency"].get<double>(), 1) << probe.dump();
  bool adamw = false;
  for (const auto& m : j["memory_ops"]) adamw = adamw || m["op"] == "adamw";
  EXPECT_TRUE(adamw) << j["memory_ops"].dump();
  // Progress went to stderr, one line per part.
  EXPECT_NE(r.err.find("GEMM fit: peak"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("attention seq 512"), std::string::npos) << r.err;
  const std::string text = read_text(out);
  EXPECT_NE(text.find("[provenance]\nhost = "), std::string::npos) << text;
  EXPECT_NE(text.find("device = \"cpu\""), std::string::npos) << text;
  EXPECT_NE(text.find("gpus = 2"), std::string::npos) << text;
  EXPECT_NE(text.find("\nprobe_step_s = "), std::string::npos) << text;
  EXPECT_NE(text.find("\noptimizer_hbm_efficiency = "), std::string::npos) << text;
  EXPECT_NE(text.find("\ntflops_bf16 = "), std::string::npos) << "the CPU backend's bf16 rate: " << text;
  EXPECT_NE(text.find("scope = \"nvlink\"\nbytes = [4096, 262144, 4194304]"), std::string::npos) << text;
  // It loads as any cluster.toml, and explain says where its figures came from.
  Result e = shell(
      d, fmt::format("{} explain --model {}/examples/models/tiny.toml --cluster {} --gpus 2", kDtplan, kRoot, out));
  ASSERT_EQ(e.exit_code, 0) << e.err;
  // Each figure's source in one column after the longest name.
  const std::regex tflops("\n  gpu\\.tflops_fp32 {20,}measured: dtplan calibrate on ");
  EXPECT_TRUE(std::regex_search(e.out, tflops)) << e.out;
  EXPECT_TRUE(std::regex_search(
      e.out, std::regex("\n  calibration\\.optimizer_hbm_efficiency +measured: dtplan calibrate on ")))
      << e.out;
  EXPECT_TRUE(std::regex_search(
      e.out, std::regex("\n  calibration\\.attention_forward_efficiency +measured: .*, at 256, 512 tokens\n")))
      << e.out;
  EXPECT_NE(e.out.find(", executor probe"), std::string::npos) << e.out;
  // --quick has no data-parallel run: the bandwidth between the ranks is the all-reduce microbenchmark's.
  EXPECT_TRUE(std::regex_search(e.out, std::regex("\n  node\\.nvlink_gbps +measured: dtplan calibrate on "))) << e.out;
  EXPECT_NE(e.out.find(", all-reduce between the ranks"), std::string::npos) << e.out;
  // --base keeps the base's other figures (its name and network) and measures as many ranks as it has GPUs.
  const std::string based = (d / "based.toml").string();
  Result b = shell(
      d, fmt::format("{} calibrate --quick --base {}/examples/clusters/local-cpu.toml -o {}", kDtplan, kRoot, based));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(b.out.find("4 rank(s) per node"), std::string::npos) << b.out;
  EXPECT_NE(read_text(based).find("name = \"local-cpu\""), std::string::npos);
}

// Starts `dtplan calibrate [extra] -o DIR/measured.toml`, sends SIGINT once its progress shows `marker`, and checks
// that it stops with exit 10, says so, and leaves no file behind.
void expect_interrupt_at(const std::string& marker, const std::vector<std::string>& extra) {
  ScratchDir scratch;
  const fs::path& d = scratch.path();
  const std::string out = (d / "measured.toml").string();
  std::vector<std::string> args{kDtplan, "calibrate"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"-o", out});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string log = (d / "log").string();
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  for (int i = 0; i < 1200 && read_text(log).find(marker) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(read_text(log).find(marker), std::string::npos) << read_text(log);
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping: " << read_text(log);
  EXPECT_EQ(WEXITSTATUS(status), 10) << read_text(log);
  EXPECT_NE(read_text(log).find("interrupted; nothing was written"), std::string::npos) << read_text(log);
  for (const auto& e : fs::directory_iterator(d)) {
    EXPECT_EQ(e.path().filename().string().rfind("measured.toml", 0), std::string::npos) << "left behind: " << e.path();
  }
}

TEST(Calibrate, AnInterruptedRunWritesNothing) { expect_interrupt_at("GEMM ", {}); }

// Interrupted while the executor probe's dtexec trains: the probe is stopped with it.
TEST(Calibrate, AnInterruptedProbeWritesNothing) { expect_interrupt_at("executor probe: dtexec trains", {"--quick"}); }

TEST(Calibrate, ImpossibleRequestsFailBeforeMeasuring) {
  ScratchDir scratch;
  const fs::path& d = scratch.path();
  Result device = shell(d, fmt::format("{} calibrate --device tpu -o {}", kDtplan, (d / "x.toml").string()));
  EXPECT_EQ(device.exit_code, 2) << device.err;
  EXPECT_NE(device.err.find("--device tpu: expected cpu or cuda"), std::string::npos) << device.err;
  // More GPUs than any machine has: refused before measuring, on a machine without a GPU (saying why none can be
  // used), with one (saying how many it has) and in a build without CUDA (saying so).
  Result gpu =
      shell(d, fmt::format("{} calibrate --device cuda --ranks-per-node 4096 -o {}", kDtplan, (d / "x.toml").string()));
  EXPECT_EQ(gpu.exit_code, 2) << gpu.err;
  EXPECT_TRUE(gpu.err.find("--device cuda: no CUDA device: ") != std::string::npos ||
              gpu.err.find("--ranks-per-node 4096: this machine has ") != std::string::npos ||
              gpu.err.find("this dtplan was built without CUDA") != std::string::npos)
      << gpu.err;
  EXPECT_EQ(gpu.err.find("GEMM"), std::string::npos) << "refused before measuring: " << gpu.err;
  Result dir = shell(d, fmt::format("{} calibrate -o {}/no/such/dir/x.toml", kDtplan, d.string()));
  EXPECT_EQ(dir.exit_code, 2) << dir.err;
  EXPECT_NE(dir.err.find("does not exist"), std::string::npos) << dir.err;
  EXPECT_EQ(dir.err.find("GEMM"), std::string::npos) << "refused before measuring: " << dir.err;
  Result base =
      shell(d, fmt::format("{} calibrate --base {}/missing.toml -o {}", kDtplan, d.string(), (d / "x.toml").string()));
  EXPECT_EQ(base.exit_code, 2) << base.err;
  EXPECT_NE(base.err.find("missing.toml"), std::string::npos) << base.err;
  EXPECT_FALSE(fs::exists(d / "x.toml"));
}

}  // namespace
}  // namespace dtrain
