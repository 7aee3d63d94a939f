// dtplan compare on a real run: the tiny model on 4 ranks (tp 2, pp 2, interleaved) trained by dtlaunch + dtexec with
// --trace and --metrics, then set beside the plan's simulation. The Perfetto trace must load in Python's json module
// with every slice nested on its track, the SVG must parse as XML and render in Chromium as the chart, and bad input
// (another plan's trace, a file that is not a trace) must be refused with its exit code and leave no output behind.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "shell.h"
#include "svg_check.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using namespace dtrain::testing;

const std::string kRoot = DTRAIN_SOURCE_DIR;
const std::string kBin = std::string(DTRAIN_BINARY_DIR) + "/bin";

using Result = ShellResult;

// One 4-rank run shared by the tests: plan, trace and metrics in a scratch directory.
class CompareTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new ScratchDir();
    const fs::path& d = scratch_->path();
    Result plan = shell(d, fmt::format("{}/dtplan plan --model {}/examples/models/tiny.toml --cluster "
                                       "{}/examples/clusters/local-cpu.toml --gpus 4 --fix dp=1,tp=2,pp=2 -o {}",
                                       kBin, kRoot, kRoot, (d / "plan.toml").string()));
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    Result train = shell(d, fmt::format("{}/dtlaunch --nproc 4 -- {}/dtexec train --model {}/examples/models/tiny.toml "
                                        "--plan {} --data synthetic --steps 4 --trace {} --metrics {}",
                                        kBin, kBin, kRoot, (d / "plan.toml").string(), (d / "measured.json").string(),
                                        (d / "metrics.jsonl").string()));
    ASSERT_EQ(train.exit_code, 0) << train.err;
    // Data parallel with the distributed optimizer: bucketed reduce-scatters and all-gathers ("#index" in their names).
    Result dopt = shell(d, fmt::format("{}/dtplan plan --model {}/examples/models/tiny.toml --cluster "
                                       "{}/examples/clusters/local-cpu.toml --gpus 4 --fix "
                                       "dp=2,tp=1,pp=2,distributed_optimizer=true -o {}",
                                       kBin, kRoot, kRoot, (d / "dopt.toml").string()));
    ASSERT_EQ(dopt.exit_code, 0) << dopt.err;
    Result dopt_train =
        shell(d, fmt::format("{}/dtlaunch --nproc 4 -- {}/dtexec train --model {}/examples/models/tiny.toml "
                             "--plan {} --data synthetic --steps 3 --trace {}",
                             kBin, kBin, kRoot, (d / "dopt.toml").string(), (d / "dopt.json").string()));
    ASSERT_EQ(dopt_train.exit_code, 0) << dopt_train.err;
    // Another plan of the same model, for the mismatch test.
    Result other = shell(d, fmt::format("{}/dtplan plan --model {}/examples/models/tiny.toml --cluster "
                                        "{}/examples/clusters/local-cpu.toml --gpus 4 --fix dp=2,tp=1,pp=2 -o {}",
                                        kBin, kRoot, kRoot, (d / "other.toml").string()));
    ASSERT_EQ(other.exit_code, 0) << other.err;
  }
  static void TearDownTestSuite() {
    delete scratch_;
    scratch_ = nullptr;
  }
  static const fs::path& dir() { return scratch_->path(); }
  static std::string path(const std::string& name) { return (dir() / name).string(); }
  Result compare(const std::string& args) { return shell(dir(), fmt::format("{}/dtplan compare {}", kBin, args)); }

  static ScratchDir* scratch_;
};

ScratchDir* CompareTest::scratch_ = nullptr;

TEST_F(CompareTest, ReportSetsEveryKindAndStageBesideItsPrediction) {
  Result r = compare(fmt::format("--plan {} --measured {} --metrics {} --json", path("plan.toml"),
                                 path("measured.json"), path("metrics.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["steps"], (std::vector<int>{2, 3, 4})) << "the first of four steps is warm-up";
  EXPECT_GT(j["predicted_step_s"].get<double>(), 0);
  EXPECT_GT(j["measured_step_s"].get<double>(), 0);
  EXPECT_EQ(j["unmatched"], 0) << "every predicted instruction has a measured slice of the same name";
  std::set<std::string> kinds;
  for (const auto& k : j["by_kind"]) {
    kinds.insert(k["key"].get<std::string>());
    EXPECT_GT(k["measured_s"].get<double>(), 0) << k.dump();
  }
  for (const char* k : {"forward", "backward", "p2p", "optimizer"}) EXPECT_TRUE(kinds.count(k)) << k;
  ASSERT_EQ(j["by_stage"].size(), 2u) << "one simulated rank per pipeline stage";
  ASSERT_EQ(j["memory"].size(), 2u);
  for (const auto& m : j["memory"]) {
    EXPECT_GT(m["predicted_bytes"].get<double>(), 0) << m.dump();
    EXPECT_GT(m["measured_bytes"].get<double>(), 0) << m.dump();
    // local-cpu.toml's runtime_reserved_gib = 0.1: set apart, since the backend's peak does not hold it.
    EXPECT_DOUBLE_EQ(m["reserved_bytes"].get<double>(), 0.1 * 1024 * 1024 * 1024) << m.dump();
  }
  EXPECT_FALSE(j["largest"].empty());
  // The text report names the same things.
  Result text = compare(fmt::format("--plan {} --measured {}", path("plan.toml"), path("measured.json")));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("step time: predicted"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("largest discrepancies"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("stage 1 (rank 2)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("(+102.4 MiB reserve)"), std::string::npos) << text.out;
}

TEST_F(CompareTest, BucketedCollectivesOfTheDistributedOptimizerMatchByName) {
  Result r = compare(fmt::format("--plan {} --measured {} --json", path("dopt.toml"), path("dopt.json")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["unmatched"], 0) << r.out;
  bool dp = false;
  for (const auto& k : j["by_kind"]) dp = dp || k["key"] == "dp";
  EXPECT_TRUE(dp) << "the data-parallel collectives are compared: " << r.out;
}

TEST_F(CompareTest, PerfettoTraceLoadsAndEverySliceNestsOnItsTrack) {
  const std::string out = path("compare-trace.json");
  Result r = compare(fmt::format("--plan {} --measured {} --trace {}", path("plan.toml"), path("measured.json"), out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Python's json module loads it, and on every (pid, tid) track each slice nests in or follows the previous ones.
  const auto check = run_python(dir(), R"PY(
import json, sys
events = json.load(open(sys.argv[1]))['traceEvents']
tracks, processes = {}, {}
for e in events:
    if e['ph'] == 'M' and e['name'] == 'process_name': processes[e['pid']] = e['args']['name'].split(' (step')[0]
    if e['ph'] == 'X': tracks.setdefault((e['pid'], e['tid']), []).append((e['ts'], e['ts'] + e['dur']))
bad = 0
for key, slices in tracks.items():
    stack = []
    for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
        while stack and stack[-1] <= start + 1e-6: stack.pop()
        if stack and end > stack[-1] + 1e-6: bad += 1
        stack.append(end)
json.dump({'bad': bad, 'slices': sum(len(v) for v in tracks.values()), 'processes': sorted(processes.values())},
          sys.stdout)
)PY",
                                {out});
  ASSERT_FALSE(check.is_null());
  EXPECT_EQ(check["bad"], 0) << check.dump();
  EXPECT_GT(check["slices"].get<int>(), 20) << check.dump();
  EXPECT_EQ(check["processes"],
            (std::vector<std::string>{"rank 0 measured", "rank 0 predicted", "rank 2 measured", "rank 2 predicted"}))
      << check.dump();
}

TEST_F(CompareTest, SvgParsesAsXmlAndRendersAsTheTwoCharts) {
  const std::string out = path("compare.svg");
  Result r = compare(fmt::format("--plan {} --measured {} --svg {}", path("plan.toml"), path("measured.json"), out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto parsed = parse_svg(dir(), read_text(out));
  ASSERT_FALSE(parsed.is_null());
  std::set<std::string> labels;
  int titled = 0, recv = 0;
  for (const auto& t : parsed["texts"]) labels.insert(t["text"].get<std::string>());
  for (const auto& rect : parsed["rects"]) {
    if (rect["title"].is_null()) continue;
    ++titled;
    if (rect["title"].get<std::string>().find("RECV act c1 mb0 <- 2") != std::string::npos) ++recv;
  }
  for (const char* l : {"rank 0 predicted", "rank 0 measured", "rank 2 predicted", "rank 2 measured"}) {
    EXPECT_TRUE(labels.count(l)) << l;
  }
  EXPECT_GT(titled, 40) << "predicted and measured slices drawn";
  EXPECT_EQ(recv, 2) << "a transfer's name survives, '<' included: once predicted, once measured";
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it)";
  const fs::path png = dir() / "compare.png";
  ASSERT_TRUE(screenshot(chromium, dir(), out, png, 1250, 300)) << read_text(dir() / "log");
  const auto pixels = count_pixels(dir(), png);
  ASSERT_FALSE(pixels.is_null());
  EXPECT_EQ(pixels["error_page"], 0) << pixels.dump();
  EXPECT_GT(pixels["forward"], 3000) << pixels.dump();
  EXPECT_GT(pixels["backward"], 3000) << pixels.dump();
  EXPECT_GT(pixels["p2p"], 300) << pixels.dump();
}

TEST_F(CompareTest, ATraceOfAnotherPlanIsRefusedNamingBothDigests) {
  const std::string out = path("mismatch.svg");
  Result r = compare(fmt::format("--plan {} --measured {} --svg {}", path("other.toml"), path("measured.json"), out));
  EXPECT_EQ(r.exit_code, 5) << r.err;
  const std::string measured_digest =
      nlohmann::json::parse(read_text(path("measured.json")))["otherData"]["plan_digest"].get<std::string>();
  EXPECT_NE(r.err.find("was measured running plan " + measured_digest), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("but the plan given is "), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out)) << "nothing written on failure";
}

TEST_F(CompareTest, AFileThatIsNotATraceIsAnInputError) {
  std::ofstream(path("not-a-trace.json")) << "{\"hello\": 1}";
  std::ofstream(path("not-json.json")) << "step 1 loss 3.2\n";
  const std::string out = path("bad.json");
  Result a =
      compare(fmt::format("--plan {} --measured {} --trace {}", path("plan.toml"), path("not-a-trace.json"), out));
  EXPECT_EQ(a.exit_code, 2) << a.err;
  EXPECT_NE(a.err.find(path("not-a-trace.json") + ": no traceEvents array"), std::string::npos) << a.err;
  Result b = compare(fmt::format("--plan {} --measured {} --trace {}", path("plan.toml"), path("not-json.json"), out));
  EXPECT_EQ(b.exit_code, 2) << b.err;
  EXPECT_NE(b.err.find(path("not-json.json") + ": not JSON"), std::string::npos) << b.err;
  // A simulated trace is a trace, but not a measured one.
  Result sim = shell(
      dir(), fmt::format("{}/dtplan simulate --plan {} --trace {}", kBin, path("plan.toml"), path("simulated.json")));
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  Result c = compare(fmt::format("--plan {} --measured {} --trace {}", path("plan.toml"), path("simulated.json"), out));
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_NE(c.err.find("not a measured trace"), std::string::npos) << c.err;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(dir())) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << "a temporary file was left: " << e.path();
  }
}

}  // namespace
}  // namespace dtrain
