// dtplan: plans 3D-parallel training, explains the plan, lowers it to per-rank programs, verifies and simulates
// them, and shows a node's topology. See docs/user-guide.md.
#include <algorithm>
#include <cstdio>
#include <string_view>
#include <utility>
#include <vector>

#include "commands.h"
#include "dtrain/common/cli_main.h"
#include "dtrain/common/log.h"
#include "dtrain/common/version.h"
#include "dtrain/kernels/threads.h"

namespace dtrain::dtplan {
namespace {

std::vector<std::pair<int, CommandSetup>>& registry() {
  static std::vector<std::pair<int, CommandSetup>> r;
  return r;
}
ExitCode g_exit_code = ExitCode::kOk;

}  // namespace

CommandRegistrar::CommandRegistrar(int order, CommandSetup setup) { registry().emplace_back(order, setup); }
void set_exit_code(ExitCode code) { g_exit_code = code; }

}  // namespace dtrain::dtplan

// run_main catches what the commands throw; building the command line throws only on a programming error.
int main(int argc, char** argv) {  // NOLINT(bugprone-exception-escape)
  using namespace dtrain;
  // calibrate measures the CPU kernels as dtexec runs them: with OpenBLAS's workers sleeping soon after a GEMM.
  if (argc > 1 && std::string_view(argv[1]) == "calibrate") kernels::cpu::shorten_blas_spin(argv);
  CLI::App app{"dtplan: plan, explain, lower, verify and simulate distributed training layouts"};
  app.set_version_flag("--version", std::string("dtplan ") + kVersion);
  app.require_subcommand(1);
  auto& reg = dtplan::registry();
  std::stable_sort(reg.begin(), reg.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [order, setup] : reg) setup(app);
  return run_main(
      app,
      [&] {
        log::init("dtplan", log::Level::kWarn);
        app.parse(argc, argv);
        return static_cast<int>(dtplan::g_exit_code);
      },
      [](const std::string& message) { std::fprintf(stderr, "dtplan: %s\n", message.c_str()); });
}
