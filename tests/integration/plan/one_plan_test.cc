// The three ways a plan is made — `dtplan plan`, `dtexec train --plan auto` (its --write-plan) and the Slurm plugin's
// step plan (spank::make_step_plan, called here without Slurm) — give the same plan file, byte for byte, for the same
// model, cluster description, shape and pinned dimensions; and when nothing fits, all three say so (exit 3). The
// matrix: every model of examples/models and bench/models, every cluster of examples/clusters, and shapes with all
// of a node's GPUs, fewer ranks than GPUs per node (a half, and three quarters: an NVLink domain that does not
// divide), one node and several.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "dtrain/common/error.h"
#include "dtrain/spank/step_plan.h"
#include "dtrain/topology/cluster_spec.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

const std::string kRoot = DTRAIN_SOURCE_DIR;
const std::string kBin = std::string(DTRAIN_BINARY_DIR) + "/bin";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> tomls(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(kRoot + "/" + dir)) {
    if (e.path().extension() == ".toml") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Case {
  std::string model;
  std::string cluster;
  int nodes = 1;
  int ranks_per_node = 1;
  std::string fix;  // pinned dimensions, "" for none

  std::string name() const {
    return fmt::format("{} on {}: {} nodes x {} ranks{}", fs::path(model).stem().string(),
                       fs::path(cluster).stem().string(), nodes, ranks_per_node, fix.empty() ? "" : " --fix " + fix);
  }
};

// What one path made: its exit code (0, or 3 when nothing fits) and the plan file's bytes.
struct Outcome {
  int exit_code = -1;
  std::string text;
  std::string log;
};

int run_shell(const std::string& command) {
  int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Outcome run_dtplan(const Case& c, const fs::path& dir) {
  fs::path out = dir / "dtplan.toml", log = dir / "dtplan.log";
  std::string cmd = fmt::format(
      "{}/dtplan plan --model {} --cluster {} --nodes {} --ranks-per-node {}{} -o {} > {} 2>&1", kBin, c.model,
      c.cluster, c.nodes, c.ranks_per_node, c.fix.empty() ? "" : " --fix " + c.fix, out.string(), log.string());
  Outcome o;
  o.exit_code = run_shell(cmd);
  o.text = o.exit_code == 0 ? slurp(out) : "";
  o.log = slurp(log);
  return o;
}

Outcome run_dtexec(const Case& c, const fs::path& dir) {
  fs::path out = dir / "dtexec.toml", log = dir / "dtexec.log";
  std::string cmd = fmt::format(
      "env -u DTRAIN_PLAN RANK=0 WORLD_SIZE={} LOCAL_WORLD_SIZE={} "
      "{}/dtexec train --model {} --plan auto --cluster {}{} --write-plan {} > {} 2>&1",
      c.nodes * c.ranks_per_node, c.ranks_per_node, kBin, c.model, c.cluster, c.fix.empty() ? "" : " --fix " + c.fix,
      out.string(), log.string());
  Outcome o;
  o.exit_code = run_shell(cmd);
  o.text = o.exit_code == 0 ? slurp(out) : "";
  o.log = slurp(log);
  return o;
}

// The plugin's step plan, as srun and every slurmstepd make it: --dtrain-plan=auto (or the pinned dimensions),
// --dtrain-model, --dtrain-cluster, a step of `nodes` nodes running `ranks_per_node` tasks each.
Outcome run_plugin(const Case& c) {
  std::map<std::string, std::string> env = {
      {"DTRAIN_PLAN", c.fix.empty() ? "auto" : c.fix}, {"DTRAIN_MODEL", c.model}, {"DTRAIN_CLUSTER", c.cluster}};
  spank::UserRequest request = spank::resolve_request({}, spank::map_environment(env), "/");
  spank::LoadedInputs in = spank::load_inputs(request, {});
  spank::StepShape shape = spank::step_shape(c.nodes, c.nodes * c.ranks_per_node, {"dtexec"});
  Outcome o;
  try {
    o.text = spank::make_step_plan(request, in, in.cluster, in.cluster_source, shape).text;
    o.exit_code = 0;
  } catch (const Error& e) {
    o.exit_code = static_cast<int>(e.exit_code());
    o.log = e.what();
  }
  return o;
}

std::vector<Case> matrix() {
  std::vector<std::string> models = tomls("examples/models");
  for (const auto& m : tomls("bench/models")) models.push_back(m);
  std::vector<std::string> clusters = tomls("examples/clusters");
  // Shapes for nodes of g GPUs: {nodes, ranks per node}.
  auto shapes = [](int g) {
    std::vector<std::pair<int, int>> s = {{1, g}, {1, std::max(1, g / 2)}, {2, std::max(1, g / 2)}, {4, g}};
    if (g >= 4) s.push_back({2, g - g / 4});  // 6 of 8, 3 of 4: the NVLink domain is fitted with a gcd
    return s;
  };
  std::vector<Case> cases;
  // The small models on every cluster in every shape; every other model on one (cluster, shape) pair, taken in
  // turn so that the pairs vary (several processes per case: the whole cross would take minutes).
  std::size_t turn = 0;
  for (const auto& m : models) {
    std::string stem = fs::path(m).stem().string();
    bool small = stem == "tiny" || stem == "small-llama";
    for (std::size_t c = 0; c < clusters.size(); ++c) {
      auto s = shapes(topology::load_cluster(clusters[c]).node.gpus);
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (small || (c == turn % clusters.size() && i == (turn / clusters.size() + turn) % s.size())) {
          cases.push_back({m, clusters[c], s[i].first, s[i].second, ""});
        }
      }
    }
    if (!small) ++turn;
  }
  cases.push_back({kRoot + "/examples/models/tiny.toml", kRoot + "/examples/clusters/dgx-a100-80g.toml", 2, 4, "tp=2"});
  cases.push_back(
      {kRoot + "/examples/models/tiny.toml", kRoot + "/examples/clusters/pcie-a100.toml", 2, 6, "pp=2,dp=3"});
  return cases;
}

TEST(OnePlan, DtplanDtexecAndThePluginMakeTheSamePlanFile) {
  if (!fs::exists(kBin + "/dtplan") || !fs::exists(kBin + "/dtexec")) {
    GTEST_SKIP() << "dtplan or dtexec is not built (" << kBin << ")";
  }
  std::vector<Case> cases = matrix();
  std::string templ = (fs::temp_directory_path() / "one-plan-XXXXXX").string();
  fs::path root = mkdtemp(templ.data());
  // The programs run in threads (each case in its own directory); the plugin's plan in this thread.
  std::vector<Outcome> dtplan(cases.size()), dtexec(cases.size());
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < cases.size(); i = next++) {
      fs::path dir = root / std::to_string(i);
      fs::create_directories(dir);
      dtplan[i] = run_dtplan(cases[i], dir);
      dtexec[i] = run_dtexec(cases[i], dir);
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t) threads.emplace_back(worker);
  std::vector<Outcome> plugin;
  for (const auto& c : cases) plugin.push_back(run_plugin(c));
  for (auto& t : threads) t.join();
  fs::remove_all(root);

  int planned = 0, infeasible = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name());
    // Planned, nothing fits, or refused as input: a model in a dtype the cluster's GPU has no rate for (the fp16
    // models on local-cpu, whose "GPU" has fp32 and bf16 rates) is refused by all three alike.
    ASSERT_TRUE(dtplan[i].exit_code == 0 || dtplan[i].exit_code == 3 ||
                (dtplan[i].exit_code == 2 && dtplan[i].log.find(" rate ([gpu] tflops_") != std::string::npos))
        << dtplan[i].log;
    EXPECT_EQ(dtexec[i].exit_code, dtplan[i].exit_code) << dtexec[i].log;
    EXPECT_EQ(plugin[i].exit_code, dtplan[i].exit_code) << plugin[i].log;
    EXPECT_EQ(dtexec[i].text, dtplan[i].text);
    EXPECT_EQ(plugin[i].text, dtplan[i].text);
    if (dtplan[i].exit_code == 0) {
      EXPECT_NE(dtplan[i].text.find(fmt::format("\nnodes = {}\ngpus_per_node = {}\ngpus = {}\n", cases[i].nodes,
                                                cases[i].ranks_per_node, cases[i].nodes * cases[i].ranks_per_node)),
                std::string::npos)
          << dtplan[i].text;
      ++planned;
    } else if (dtplan[i].exit_code == 3) {
      ++infeasible;
    }
  }
  // The matrix exercises both outcomes.
  EXPECT_GT(planned, 30);
  EXPECT_GT(infeasible, 0);
}

// dtexec plans for whole nodes: a world that LOCAL_WORLD_SIZE does not divide is refused, naming both.
TEST(OnePlan, DtexecRefusesAWorldThatIsNotWholeNodes) {
  std::string templ = (fs::temp_directory_path() / "one-plan-XXXXXX").string();
  fs::path dir = mkdtemp(templ.data());
  Case c{kRoot + "/examples/models/tiny.toml", kRoot + "/examples/clusters/local-cpu.toml", 1, 4, ""};
  std::string cmd = fmt::format(
      "env -u DTRAIN_PLAN WORLD_SIZE=6 LOCAL_WORLD_SIZE=4 {}/dtexec train --model {} --plan auto --cluster {} "
      "--write-plan {} > {} 2>&1",
      kBin, c.model, c.cluster, (dir / "p.toml").string(), (dir / "log").string());
  EXPECT_EQ(run_shell(cmd), 2);
  EXPECT_NE(slurp(dir / "log").find("WORLD_SIZE=6 is not a multiple of the 4 ranks per node"), std::string::npos)
      << slurp(dir / "log");
  EXPECT_FALSE(fs::exists(dir / "p.toml"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain
