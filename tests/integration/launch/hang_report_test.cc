// dtlaunch's hang report (dtrain/launch/hang_report.h) on real hangs of a 4-rank tp2 pp2 dtexec job: one rank stopped
// (SIGSTOP), one rank held in compute at a chosen pc (DTRAIN_TEST_HOLD), one rank running an edited program that joins
// another collective than its peers (DTRAIN_TEST_SWAP). Each report must name the right root rank and instruction,
// within the heartbeat timeout plus 5 s of the hang (the hang's detection: --heartbeat-timeout for the stopped rank,
// --progress-timeout for the held one, dtexec's communication timeout for the edited program).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "dtrain/ir/lower.h"
#include "dtrain/plan/plan_file.h"
#include "launch_harness.h"

namespace dtrain::launch::testing {
namespace {

using ::testing::HasSubstr;

class HangReportTest : public LaunchTest {
 protected:
  void SetUp() override {
    LaunchTest::SetUp();
    if (!std::filesystem::exists(dtexec_path())) GTEST_SKIP() << "dtexec is not built";
    plan_ = dir() + "/plan.toml";
    const std::string cluster = std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/local-cpu.toml";
    ASSERT_EQ(run_command({dtplan_path(), "plan", "--model", tiny_model(), "--cluster", cluster, "--gpus", "4", "--fix",
                           "tp=2,pp=2,dp=1,vpp=1,schedule=1f1b", "-o", plan_},
                          dir() + "/plan.log"),
              0)
        << read_file(dir() + "/plan.log");
    programs_ = ir::lower_all(plan::load_plan(plan_));
  }

  std::unique_ptr<LaunchProcess> start(std::vector<std::string> options, std::map<std::string, std::string> env,
                                       std::vector<std::string> extra = {}, int steps = 400) {
    options.insert(options.end(), {"--nproc", "4", "--max-restarts", "0", "--run-dir", dir() + "/run", "--",
                                   dtexec_path(), "train", "--model", tiny_model(), "--plan", plan_, "--steps",
                                   std::to_string(steps), "--metrics", dir() + "/metrics.jsonl", "--threads", "1"});
    options.insert(options.end(), extra.begin(), extra.end());
    return std::make_unique<LaunchProcess>(options, env, dir() + "/job");
  }
  int steps_done() const { return static_cast<int>(steps_in(dir() + "/metrics.jsonl").size()); }
  bool wait_for_steps(int steps, std::chrono::seconds timeout) const {
    const auto deadline = Clock::now() + timeout;
    while (steps_done() < steps) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }
  // The report's JSON once it exists (waits up to `timeout`); null when it never came.
  nlohmann::json wait_for_report(std::chrono::seconds timeout) const {
    const std::string path = dir() + "/run/hang-report-attempt0.json";
    const auto deadline = Clock::now() + timeout;
    while (!std::filesystem::exists(path)) {
      if (Clock::now() > deadline) return nullptr;
      std::this_thread::sleep_for(10ms);
    }
    return nlohmann::json::parse(read_file(path));
  }
  pid_t rank_pid(int rank) const { return rank_process(plan_, dtexec_path(), rank); }
  std::size_t find(int rank, ir::Opcode op, ir::What what) const {
    const auto& p = programs_[static_cast<std::size_t>(rank)];
    for (std::size_t pc = 0; pc < p.schedule.size(); ++pc) {
      if (p.schedule[pc].op == op && p.schedule[pc].what == what) return pc;
    }
    ADD_FAILURE() << "no such instruction in rank " << rank << "'s program";
    return 0;
  }

  std::string plan_;
  std::vector<ir::Program> programs_;
};

TEST_F(HangReportTest, AStoppedRankIsTheRoot) {
  auto p = start({"--heartbeat-timeout", "2"}, {});
  ASSERT_TRUE(wait_for_steps(3, 120s)) << p->err();
  const pid_t victim = rank_pid(2);
  ASSERT_GT(victim, 0);
  const auto stopped = Clock::now();
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  nlohmann::json report = wait_for_report(30s);
  const double took = std::chrono::duration<double>(Clock::now() - stopped).count();
  ASSERT_FALSE(report.is_null()) << p->err();
  EXPECT_LT(took, 2.0 + 5.0);
  EXPECT_NE(p->wait(60s), 0);
  EXPECT_EQ(report["roots"], nlohmann::json::array({2})) << report.dump(2);
  EXPECT_THAT(report["ranks"][2]["doing"].get<std::string>(), HasSubstr("stopped (SIGSTOP)"));
  for (int r : {0, 1, 3}) EXPECT_EQ(report["ranks"][r]["chain"].back(), 2) << report.dump(2);
  EXPECT_THAT(p->err(), HasSubstr("hang report (attempt 0, after: rank 2 on node 0"));
  EXPECT_THAT(p->err(), HasSubstr("rank 2 (root): stopped (SIGSTOP)"));
  std::printf("report %.2f s after SIGSTOP\n", took);
}

TEST_F(HangReportTest, ARankHeldInComputeIsTheRootWithItsInstruction) {
  // Rank 3 (stage 1) holds in its first forward of step 4; stage 0 waits to send to it, its tp peer waits inside.
  const std::size_t pc = find(3, ir::Opcode::kForward, ir::What::kNone);
  const std::string expected = ir::to_text(programs_[3].schedule[pc]);
  auto p = start({"--heartbeat-timeout", "2", "--progress-timeout", "3"},
                 {{"DTRAIN_TEST_HOLD", "3:4:" + std::to_string(pc)}});
  ASSERT_TRUE(wait_for_steps(3, 120s)) << p->err();
  const auto held = Clock::now();
  nlohmann::json report = wait_for_report(30s);
  const double took = std::chrono::duration<double>(Clock::now() - held).count();
  ASSERT_FALSE(report.is_null()) << p->err();
  EXPECT_LT(took, 2.0 + 5.0);
  EXPECT_NE(p->wait(60s), 0);
  EXPECT_EQ(report["roots"], nlohmann::json::array({3})) << report.dump(2);
  const std::string doing = report["ranks"][3]["doing"];
  EXPECT_THAT(doing, HasSubstr("in compute at `" + expected + "` (step 4 pc " + std::to_string(pc) + ")"));
  for (int r : {0, 1, 2}) EXPECT_EQ(report["ranks"][r]["chain"].back(), 3) << report.dump(2);
  EXPECT_THAT(p->err(), HasSubstr("rank 3 (root): in compute at `" + expected));
  std::printf("report %.2f s after the hold began (at most)\n", took);
}

TEST_F(HangReportTest, ARankRunningAnEditedProgramIsTheRootNamingBothInstructions) {
  // Rank 1 swaps its last tp reduction of replicated gradients with the world's gradient-norm all-reduce: it waits
  // in the world all-reduce while its tp peer waits for it in the tp one. Communication times out after 4 s.
  const std::size_t norm = find(1, ir::Opcode::kAllReduce, ir::What::kGradNorm);
  ASSERT_GT(norm, 0u);
  const auto& before = programs_[1].schedule[norm - 1];
  ASSERT_EQ(before.what, ir::What::kReplicatedGrads) << ir::to_text(before);
  auto p =
      start({"--heartbeat-timeout", "2"},
            {{"DTRAIN_TEST_SWAP", "1:" + std::to_string(norm - 1) + ":" + std::to_string(norm)}}, {"--timeout-s", "4"});
  nlohmann::json report = wait_for_report(120s);
  ASSERT_FALSE(report.is_null()) << p->err();
  EXPECT_NE(p->wait(60s), 0);
  EXPECT_EQ(report["roots"], nlohmann::json::array({1})) << report.dump(2);
  EXPECT_TRUE(report["ranks"][1]["other_program"].get<bool>());
  const std::string doing = report["ranks"][1]["doing"];
  EXPECT_THAT(doing, HasSubstr("runs another program than the plan's"));
  EXPECT_THAT(doing, HasSubstr("`" + ir::to_text(programs_[1].schedule[norm]) + "`"));
  EXPECT_THAT(doing, HasSubstr("where the plan has `" + ir::to_text(before) + "`"));
  EXPECT_EQ(report["ranks"][0]["chain"].back(), 1) << report.dump(2);
}

// SIGUSR1 to a running job's dtlaunch: where every rank is, at once, and the job goes on to its end.
TEST_F(HangReportTest, SigusrOneReportsOnARunningJobWhichGoesOn) {
  auto p = start({}, {}, {}, 60);
  ASSERT_TRUE(wait_for_steps(3, 120s)) << p->err();
  std::this_thread::sleep_for(1500ms);  // a where line after the first steps (one per beat: every second here)
  p->signal(SIGUSR1);
  std::string report_path;
  const auto deadline = Clock::now() + 20s;
  while (report_path.empty() && Clock::now() < deadline) {
    for (const auto& e : std::filesystem::directory_iterator(dir() + "/run")) {
      if (e.path().filename().string().rfind("status-report-attempt0-", 0) == 0) report_path = e.path().string();
    }
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(report_path.empty()) << p->err();
  EXPECT_EQ(p->wait(120s), 0) << p->err();
  auto report = nlohmann::json::parse(read_file(report_path));
  EXPECT_TRUE(report["on_demand"].get<bool>());
  ASSERT_EQ(report["positions"].size(), 4u);
  for (const auto& pos : report["positions"]) {
    EXPECT_TRUE(pos["known"].get<bool>()) << pos.dump();
    EXPECT_GE(pos["step"].get<int>(), 3) << pos.dump();
    EXPECT_LT(pos["age_s"].get<double>(), 1.5) << pos.dump();
  }
  EXPECT_THAT(p->err(), HasSubstr("where every rank is, on demand"));
  EXPECT_EQ(steps_done(), 60);
}

}  // namespace
}  // namespace dtrain::launch::testing
