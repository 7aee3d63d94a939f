// Going on with fewer nodes (docs/launcher.md, "Fewer nodes"): 4 agents on loopback, --nnodes 3:4, one rank each,
// dtexec training with --plan auto and checkpoints. One node's agent and its rank are killed (SIGKILL) at a random
// step: the job goes on with 3 nodes, planned again for 3 ranks, resumed from its newest checkpoint resharded, and
// its losses after the resume equal bitwise those of a reference run that resumes that checkpoint directly on 3
// nodes. A loss that leaves fewer than MIN nodes, and the loss of node 0, end the job with exit 11.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "launch_harness.h"

namespace dtrain::launch::testing {
namespace {

using ::testing::HasSubstr;

std::string model() { return std::string(DTRAIN_SOURCE_DIR) + "/tests/data/models/tiny-elastic.toml"; }
constexpr int kSteps = 40;
constexpr int kCheckpointEvery = 4;

class ElasticTest : public LaunchTest {
 protected:
  void SetUp() override {
    LaunchTest::SetUp();
    if (!std::filesystem::exists(dtexec_path())) GTEST_SKIP() << "dtexec is not built";
  }
  // One node's dtlaunch of a `nnodes`-node job (--nnodes MIN:MAX when min < nnodes) training into `name`.
  std::unique_ptr<LaunchProcess> node(const std::string& name, int node_rank, int nnodes, int min, std::uint16_t port,
                                      const std::vector<std::string>& extra = {}) {
    std::vector<std::string> o{
        "--nnodes",
        min < nnodes ? std::to_string(min) + ":" + std::to_string(nnodes) : std::to_string(nnodes),
        "--node-rank",
        std::to_string(node_rank),
        "--rdzv",
        "127.0.0.1:" + std::to_string(port),
        "--nproc",
        "1",
        "--node-timeout",
        "2",
        "--max-restarts",
        "1",
        "--run-dir",
        dir() + "/" + name + ".run",
        "--",
        dtexec_path(),
        "train",
        "--model",
        model(),
        "--plan",
        "auto",
        "--steps",
        std::to_string(kSteps),
        "--seed",
        "3",
        "--threads",
        "1",
        "--deterministic",
        "--checkpoint-dir",
        dir() + "/" + name + ".ckpt",
        "--checkpoint-every",
        std::to_string(kCheckpointEvery),
        "--keep-checkpoints",
        "100",
        "--metrics",
        dir() + "/" + name + ".jsonl"};
    o.insert(o.end(), extra.begin(), extra.end());
    return std::make_unique<LaunchProcess>(o, std::map<std::string, std::string>{{"DTRAIN_STORE_TOKEN", "el-" + tag()}},
                                           dir() + "/" + name + ".node" + std::to_string(node_rank));
  }
  std::map<int, std::string> losses(const std::string& name) const { return loss_texts(dir() + "/" + name + ".jsonl"); }
  std::vector<int> steps(const std::string& name) const { return steps_in(dir() + "/" + name + ".jsonl"); }
  bool wait_until(const std::function<bool()>& done, std::chrono::seconds timeout) const {
    const auto deadline = Clock::now() + timeout;
    while (!done()) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(5ms);
    }
    return true;
  }
};

TEST_F(ElasticTest, LosingANodeGoesOnWithThreeAndEqualsAResumeOnThree) {
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937 rng(seed);
  const int kill_after = std::uniform_int_distribution<int>(kCheckpointEvery + 1, kSteps - 12)(rng);
  SCOPED_TRACE("node 3 killed after step " + std::to_string(kill_after) + " (random seed " + std::to_string(seed) +
               ")");
  const auto port = free_port();
  std::vector<std::unique_ptr<LaunchProcess>> nodes;
  for (int n = 0; n < 4; ++n) nodes.push_back(node("job", n, 4, 3, port));
  ASSERT_TRUE(wait_until([&] { return !steps("job").empty() && steps("job").back() >= kill_after; }, 120s))
      << nodes[0]->err();
  const auto killed = Clock::now();
  nodes[3]->signal(SIGKILL);  // the agent; its rank follows through the parent-death signal
  // The last step written once the agent is gone (on a loaded machine, later than kill_after): a step is written
  // only after every rank's all-gather, so at most the one in flight can follow.
  const int written_at_kill = steps("job").back();
  // Training runs again: the next attempt started, and a step was written after that.
  ASSERT_TRUE(wait_until([&] { return nodes[0]->err().find("attempt 1: started") != std::string::npos; }, 120s))
      << nodes[0]->err();
  const std::size_t lines_then = steps("job").size();
  ASSERT_TRUE(wait_until([&] { return steps("job").size() > lines_then; }, 120s)) << nodes[0]->err();
  const double back_s = std::chrono::duration<double>(Clock::now() - killed).count();
  std::printf("training ran again %.2f s after the kill (node timeout 2 s)\n", back_s);
  for (int n = 0; n < 3; ++n) EXPECT_EQ(nodes[n]->wait(180s), 0) << "node " << n << ": " << nodes[n]->err();
  const std::string err = nodes[0]->err();
  EXPECT_THAT(err, HasSubstr("node 3 was lost"));
  EXPECT_THAT(err, HasSubstr("the job goes on with 3 of its 4 nodes (0, 1, 2), world size 3"));
  EXPECT_THAT(err, HasSubstr("the ranks planned again for 3 ranks: layout tp=1 pp=1 dp=3"));
  // Where it resumed: rank 0's log names the checkpoint.
  const auto at = err.find("resuming from the checkpoint of step ");
  ASSERT_NE(at, std::string::npos) << err;
  const int resumed = std::stoi(err.substr(at + 37));
  EXPECT_EQ(resumed % kCheckpointEvery, 0);
  EXPECT_LE(resumed, written_at_kill + 1);
  // The reference: that checkpoint alone, resumed directly on 3 nodes (--resume: it was another job's).
  const std::string step_dir = "step-" + std::string(8 - std::to_string(resumed).size(), '0') + std::to_string(resumed);
  std::filesystem::create_directories(dir() + "/ref.ckpt");
  std::filesystem::copy(dir() + "/job.ckpt/" + step_dir, dir() + "/ref.ckpt/" + step_dir,
                        std::filesystem::copy_options::recursive);
  const auto port2 = free_port();
  std::vector<std::unique_ptr<LaunchProcess>> ref;
  for (int n = 0; n < 3; ++n) ref.push_back(node("ref", n, 3, 3, port2, {"--resume"}));
  for (int n = 0; n < 3; ++n) ASSERT_EQ(ref[n]->wait(180s), 0) << ref[n]->err();
  const auto got = losses("job");
  const auto expected = losses("ref");
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kSteps - resumed));
  for (const auto& [step, loss] : expected) EXPECT_EQ(got.at(step), loss) << "step " << step;
  // The hang report of the attempt that lost the node names its rank as the root.
  auto report = nlohmann::json::parse(read_file(dir() + "/job.run/hang-report-attempt0.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << err;
  EXPECT_EQ(report["roots"], nlohmann::json::array({3})) << report.dump(2);
  EXPECT_THAT(report["ranks"][3]["doing"].get<std::string>(), HasSubstr("lost with node 3"));
  // Nothing half-written: every checkpoint directory is complete (no step-N.tmp left).
  for (const auto& e : std::filesystem::directory_iterator(dir() + "/job.ckpt")) {
    EXPECT_EQ(e.path().extension(), "") << e.path();
  }
}

TEST_F(ElasticTest, LosingMoreThanAllowedEndsWithItsOwnExitCode) {
  const auto port = free_port();
  std::vector<std::unique_ptr<LaunchProcess>> nodes;
  for (int n = 0; n < 3; ++n) nodes.push_back(node("few2", n, 3, 2, port));
  ASSERT_TRUE(wait_until([&] { return steps("few2").size() >= 2; }, 120s)) << nodes[0]->err();
  nodes[2]->signal(SIGKILL);
  // Losing node 2 leaves 2 = MIN: the job goes on; losing node 1 as well leaves 1 < MIN: exit 11.
  ASSERT_TRUE(wait_until(
      [&] { return nodes[0]->err().find("the job goes on with 2 of its 3 nodes") != std::string::npos; }, 60s))
      << nodes[0]->err();
  ASSERT_TRUE(wait_until([&] { return steps("few2").size() >= 6; }, 120s)) << nodes[0]->err();
  nodes[1]->signal(SIGKILL);
  EXPECT_EQ(nodes[0]->wait(60s), 11) << nodes[0]->err();
  EXPECT_THAT(nodes[0]->err(), HasSubstr("1 of the job's nodes would be left, fewer than the 2 it needs"));
}

TEST_F(ElasticTest, LosingNodeZeroEndsTheJobSayingWhy) {
  const auto port = free_port();
  std::vector<std::unique_ptr<LaunchProcess>> nodes;
  for (int n = 0; n < 3; ++n) nodes.push_back(node("zero", n, 3, 2, port));
  ASSERT_TRUE(wait_until([&] { return steps("zero").size() >= 2; }, 120s)) << nodes[0]->err();
  nodes[0]->signal(SIGKILL);
  for (int n = 1; n < 3; ++n) {
    EXPECT_EQ(nodes[n]->wait(60s), 11) << nodes[n]->err();
    EXPECT_THAT(nodes[n]->err(), HasSubstr("node 0 hosts the job's store"));
  }
}

// An elastic job whose ranks would run a plan file (made for MAX nodes) cannot go on with fewer: refused at start.
TEST_F(ElasticTest, APlanFileIsRefusedAtStart) {
  const std::string plan = dir() + "/p.toml";
  const std::string cluster = std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/local-cpu.toml";
  ASSERT_EQ(run_command({dtplan_path(), "plan", "--model", model(), "--cluster", cluster, "--gpus", "2", "-o", plan},
                        dir() + "/plan.log"),
            0)
      << read_file(dir() + "/plan.log");
  LaunchProcess p({"--nnodes", "1:2", "--node-rank", "0", "--rdzv", "127.0.0.1:" + std::to_string(free_port()),
                   "--nproc", "1", "--", dtexec_path(), "train", "--model", model(), "--plan", plan},
                  {{"DTRAIN_STORE_TOKEN", "el-" + tag()}}, dir() + "/planfile");
  EXPECT_EQ(p.wait(30s), 2) << p.err();
  EXPECT_THAT(p.err(), HasSubstr("--nnodes 1:2: after losing a node the ranks must plan again"));
  EXPECT_THAT(p.err(), HasSubstr("give the rank's program --plan auto"));
}

}  // namespace
}  // namespace dtrain::launch::testing
