// dtlaunch with the real programs: plan files made by dtplan (the plan digest check between nodes), and dtexec
// training the tiny model on 4 ranks (the fault tests of issue 6: a rank killed with kill -9 at a random step, a
// rank stopped with SIGSTOP, a preempted job), checked against an uninterrupted run bitwise in deterministic mode. The
// jobs train on a blend of two real texts as Megatron datasets (docs/data.md), so that a resume must continue the
// blend's sample sequence exactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "launch_harness.h"
#include "text_dataset.h"

namespace dtrain::launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(LaunchTest, NodesWithDifferentPlansFailWithBothDigests) {
  const std::string p2 = dir() + "/p2.toml", p4 = dir() + "/p4.toml";
  const std::string cluster = std::string(DTRAIN_SOURCE_DIR) + "/examples/clusters/local-cpu.toml";
  ASSERT_EQ(run_command({dtplan_path(), "plan", "--model", tiny_model(), "--cluster", cluster, "--gpus", "2", "-o", p2},
                        dir() + "/plan2.log"),
            0)
      << read_file(dir() + "/plan2.log");
  ASSERT_EQ(run_command({dtplan_path(), "plan", "--model", tiny_model(), "--cluster", cluster, "--gpus", "4", "-o", p4},
                        dir() + "/plan4.log"),
            0);
  const auto port = free_port();
  const std::map<std::string, std::string> env{{"DTRAIN_STORE_TOKEN", "plans-" + tag()}};
  auto opts = [&](int node) {
    return std::vector<std::string>{
        "--nnodes", "2", "--node-rank", std::to_string(node), "--rdzv", "127.0.0.1:" + std::to_string(port),
        "--nproc",  "1"};
  };
  auto n0 = launch(opts(0), {"--plan", p2}, env, "node0");
  auto n1 = launch(opts(1), {"--plan", p4}, {{"DTRAIN_STORE_TOKEN", "plans-" + tag()}}, "node1");
  EXPECT_EQ(n0->wait(), 5) << n0->err();
  EXPECT_EQ(n1->wait(), 5) << n1->err();
  for (const auto* p : {n0.get(), n1.get()}) {
    EXPECT_THAT(p->err(), HasSubstr("(--plan " + p4 + ") but node 0"));
    EXPECT_THAT(p->err(), HasSubstr("(--plan " + p2 + "): every node must run the same plan file"));
  }
  EXPECT_FALSE(has_rank_file(0, 0));
  // The same plan on both nodes, through DTRAIN_PLAN on one of them: no complaint.
  const auto port2 = free_port();
  auto opts2 = [&](int node) {
    return std::vector<std::string>{
        "--nnodes", "2", "--node-rank", std::to_string(node), "--rdzv", "127.0.0.1:" + std::to_string(port2),
        "--nproc",  "1"};
  };
  auto m0 = launch(opts2(0), {"--plan", p2}, env, "node0b");
  auto m1 = launch(opts2(1), {}, {{"DTRAIN_STORE_TOKEN", "plans-" + tag()}, {"DTRAIN_PLAN", p2}}, "node1b");
  EXPECT_EQ(m0->wait(), 0) << m0->err();
  EXPECT_EQ(m1->wait(), 0) << m1->err();
}

// --- dtexec -----------------------------------------------------------------------------------------------------

// The blend the dtexec jobs train on: the GPL (weight 0.6) and the Apache license (0.4), made once per test program.
const std::string& blend() {
  static const std::string spec = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("dtrain-launch-blend-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::atexit([] {
      std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                  ("dtrain-launch-blend-" + std::to_string(::getpid())));
    });
    return "0.6 " + dtrain::testing::byte_text_dataset((dir / "gpl").string(), "/usr/share/common-licenses/GPL-3") +
           " 0.4 " +
           dtrain::testing::byte_text_dataset((dir / "apache").string(), "/usr/share/common-licenses/Apache-2.0");
  }();
  return spec;
}

// The tiny model on 4 ranks, deterministic, checkpointing every few steps.
class DtexecJobTest : public LaunchTest {
 protected:
  static constexpr int kSteps = 60;
  static constexpr int kCheckpointEvery = 8;

  void SetUp() override {
    LaunchTest::SetUp();
    if (!std::filesystem::exists(dtexec_path())) GTEST_SKIP() << "dtexec is not built (" << dtexec_path() << ")";
  }

  // With `resume`, the command carries --resume; without, a restart must resume from the job's own checkpoints
  // all the same (DTRAIN_JOB_ID, docs/launcher.md "Restarts").
  std::vector<std::string> dtexec_command(const std::string& name, int checkpoint_every = kCheckpointEvery,
                                          bool resume = true) const {
    std::vector<std::string> command{"--",
                                     dtexec_path(),
                                     "train",
                                     "--model",
                                     tiny_model(),
                                     "--plan",
                                     "auto",
                                     "--data",
                                     blend(),
                                     "--steps",
                                     std::to_string(kSteps),
                                     "--seed",
                                     "7",
                                     "--checkpoint-dir",
                                     dir() + "/" + name + ".ckpt",
                                     "--checkpoint-every",
                                     std::to_string(checkpoint_every),
                                     "--deterministic",
                                     "--metrics",
                                     dir() + "/" + name + ".jsonl"};
    if (resume) command.push_back("--resume");
    return command;
  }
  std::unique_ptr<LaunchProcess> launch_dtexec(const std::string& name, std::vector<std::string> options,
                                               int checkpoint_every = kCheckpointEvery, bool resume = true) {
    options.push_back("--run-dir");
    options.push_back(dir() + "/" + name + ".run");
    for (const auto& a : dtexec_command(name, checkpoint_every, resume)) options.push_back(a);
    return std::make_unique<LaunchProcess>(options, std::map<std::string, std::string>{}, dir() + "/" + name);
  }
  std::vector<std::pair<std::string, nlohmann::json>> metrics(const std::string& name) const {
    return metrics_lines(dir() + "/" + name + ".jsonl");
  }
  std::map<int, std::string> losses(const std::string& name) const { return loss_texts(dir() + "/" + name + ".jsonl"); }
  std::vector<int> steps_written(const std::string& name) const { return steps_in(dir() + "/" + name + ".jsonl"); }
  bool wait_for_step(const std::string& name, int step, std::chrono::milliseconds timeout) const {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      auto steps = steps_written(name);
      if (!steps.empty() && steps.back() >= step) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(2ms);
    }
  }
  // The pid of the dtexec process with RANK=rank whose command line names `marker` (default: name's checkpoint
  // directory).
  pid_t dtexec_pid(const std::string& name, int rank, std::string marker = "") const {
    if (marker.empty()) marker = dir() + "/" + name + ".ckpt";
    return rank_process(marker, dtexec_path(), rank);
  }
  // The steps of name's complete checkpoints, oldest first.
  std::vector<std::string> checkpoint_steps(const std::string& name) const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir() + "/" + name + ".ckpt")) {
      out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<nlohmann::json> events_named_in(const std::string& name, const std::string& event) const {
    std::vector<nlohmann::json> out;
    for (const auto& line : lines_of(read_file(dir() + "/" + name + ".run/events-node0.jsonl"))) {
      if (line.empty()) continue;
      auto e = nlohmann::json::parse(line);
      if (e["event"] == event) out.push_back(e);
    }
    return out;
  }
  // Steps whose loss differs between two runs, for a readable failure.
  static std::string differences(const std::map<int, std::string>& got, const std::map<int, std::string>& expected) {
    std::string out;
    for (const auto& [step, loss] : expected) {
      auto it = got.find(step);
      std::string g = it == got.end() ? "(missing)" : it->second;
      if (g != loss) out += "step " + std::to_string(step) + ": " + g + " instead of " + loss + "\n";
    }
    for (const auto& [step, loss] : got) {
      if (expected.count(step) == 0) out += "step " + std::to_string(step) + " not expected: " + loss + "\n";
    }
    return out;
  }
  static std::map<int, std::string> up_to(const std::map<int, std::string>& losses, int last_step) {
    std::map<int, std::string> out;
    for (const auto& [step, loss] : losses) {
      if (step <= last_step) out[step] = loss;
    }
    return out;
  }
  static std::string fmt_step(int step) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08d", step);
    return name;
  }
  // After a restart the job ends where the uninterrupted run ends (dtexec's --steps is the step to train until).
  static void expect_job_ends_at_the_last_step(const std::map<int, std::string>& got) {
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got.rbegin()->first, kSteps) << "the restarted job did not end at the uninterrupted run's last step";
  }
  // The uninterrupted run's losses (computed once per test: the runs are deterministic).
  std::map<int, std::string> reference() {
    auto ref = launch_dtexec("reference", {"--nproc", "4"});
    EXPECT_EQ(ref->wait(120s), 0) << ref->err();
    auto l = losses("reference");
    EXPECT_EQ(l.size(), static_cast<std::size_t>(kSteps));
    return l;
  }
};

// The command has no --resume: the restart resumes from the checkpoints this job wrote all the same.
TEST_F(DtexecJobTest, KillNineAtARandomStepResumesBitwiseWithoutResumeFlag) {
  const auto expected = reference();
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kSteps));
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937 rng(seed);
  const int kill_step = std::uniform_int_distribution<int>(kCheckpointEvery + 1, kSteps - 10)(rng);
  const int victim_rank = std::uniform_int_distribution<int>(0, 3)(rng);
  SCOPED_TRACE("kill -9 of rank " + std::to_string(victim_rank) + " after step " + std::to_string(kill_step) +
               " (random seed " + std::to_string(seed) + ")");
  auto p = launch_dtexec("faulty", {"--nproc", "4", "--max-restarts", "2"}, kCheckpointEvery, /*resume=*/false);
  ASSERT_TRUE(wait_for_step("faulty", kill_step, 120s)) << p->err();
  const pid_t victim = dtexec_pid("faulty", victim_rank);
  ASSERT_GT(victim, 0) << "no dtexec process of rank " << victim_rank;
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_EQ(p->wait(180s), 0) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("rank " + std::to_string(victim_rank) + " on node 0 (pid " + std::to_string(victim) +
                                  ") killed by signal 9 (SIGKILL)"));
  EXPECT_THAT(p->err(), HasSubstr("a restart resumes from the newest checkpoint this job writes in"));
  EXPECT_THAT(p->err(), HasSubstr("restarting the job from its newest checkpoint in " + dir() + "/faulty.ckpt"));
  EXPECT_THAT(p->err(), HasSubstr("restart 1 of 2 (DTRAIN_RESTART=1)"));
  EXPECT_THAT(p->err(), HasSubstr("restart 1 of job "));
  // The restart resumed from a checkpoint (the metrics go on from a checkpointed step, not from step 1) ...
  auto steps = steps_written("faulty");
  auto restart_at = std::adjacent_find(steps.begin(), steps.end(), [](int a, int b) { return b <= a; });
  ASSERT_NE(restart_at, steps.end()) << "no step was repeated after the restart";
  const int resumed_from = *(restart_at + 1) - 1;
  EXPECT_GT(resumed_from, 0) << "the restarted job started over instead of resuming";
  EXPECT_EQ(resumed_from % kCheckpointEvery, 0);
  // ... and every step up to the last one of the uninterrupted run has bitwise its loss.
  auto got = losses("faulty");
  EXPECT_EQ(differences(up_to(got, kSteps), expected), "") << read_file(dir() + "/faulty.jsonl");
  EXPECT_EQ(got.at(kSteps), expected.at(kSteps));
  expect_job_ends_at_the_last_step(got);

  // A new job on the same directory without --resume is still refused (exit 7), naming the job that wrote it, and
  // leaves every checkpoint as it was.
  const auto before = checkpoint_steps("faulty");
  ASSERT_FALSE(before.empty());
  auto again = launch_dtexec("faulty", {"--nproc", "4", "--max-restarts", "2"}, kCheckpointEvery, /*resume=*/false);
  EXPECT_EQ(again->wait(60s), 7) << again->err();
  EXPECT_THAT(again->err(), HasSubstr("already holds checkpoints of this model (newest: step " +
                                      std::to_string(kSteps) + ", written by job "));
  EXPECT_THAT(again->err(), HasSubstr("pass --resume"));
  EXPECT_EQ(checkpoint_steps("faulty"), before);
}

// A dtexec training that may restart but has no checkpoint directory: dtlaunch says at start that a restart trains
// again from step 0, and the restart does so (its metrics file starts over and ends with every step once).
TEST_F(DtexecJobTest, RestartWithoutCheckpointDirectoryStartsOverAndSaysSo) {
  constexpr int kPlainSteps = 30;
  std::vector<std::string> options{"--nproc",
                                   "2",
                                   "--max-restarts",
                                   "1",
                                   "--run-dir",
                                   dir() + "/plain.run",
                                   "--",
                                   dtexec_path(),
                                   "train",
                                   "--model",
                                   tiny_model(),
                                   "--steps",
                                   std::to_string(kPlainSteps),
                                   "--seed",
                                   "7",
                                   "--metrics",
                                   dir() + "/plain.jsonl"};
  auto p = std::make_unique<LaunchProcess>(options, std::map<std::string, std::string>{}, dir() + "/plain");
  ASSERT_TRUE(wait_for_step("plain", 5, 120s)) << p->err();
  const pid_t victim = dtexec_pid("plain", 1, dir() + "/plain.jsonl");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_EQ(p->wait(120s), 0) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("the command has no --checkpoint-dir: a restart trains again from step 0"));
  EXPECT_THAT(p->err(), HasSubstr("restarting the job from step 0 (the command has no --checkpoint-dir)"));
  std::vector<int> every_step(kPlainSteps);
  std::iota(every_step.begin(), every_step.end(), 1);
  EXPECT_EQ(steps_written("plain"), every_step);
}

TEST_F(DtexecJobTest, StoppedRankIsDetectedByItsHeartbeatsAndRestarted) {
  const auto expected = reference();
  auto p = launch_dtexec("stopped", {"--nproc", "4", "--heartbeat-timeout", "2", "--max-restarts", "2"});
  ASSERT_TRUE(wait_for_step("stopped", kCheckpointEvery + 1, 120s)) << p->err();
  ASSERT_FALSE(events_named_in("stopped", "ranks_alive").empty())
      << "dtexec sent no heartbeats (dtrain::launch::Heartbeat from DTRAIN_HEARTBEAT_FD): " << p->err();
  const pid_t victim = dtexec_pid("stopped", 2);
  ASSERT_GT(victim, 0);
  const auto stopped_at = Clock::now();
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const auto deadline = stopped_at + 10s;
  while (events_named_in("stopped", "end").empty() && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  const double detected_s = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  EXPECT_LT(detected_s, 2.0 + 1.0);
  ASSERT_EQ(p->wait(180s), 0) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("rank 2 on node 0 (pid " + std::to_string(victim) + ") sent no heartbeat"));
  auto got = losses("stopped");
  EXPECT_EQ(differences(up_to(got, kSteps), expected), "");
  expect_job_ends_at_the_last_step(got);
}

// Stragglers (dtrain/launch/straggler.h): 4 ranks of the tiny model, plain training (no checkpoints), the agent
// comparing each rank's work outside communication with its peers'.
class StragglerJobTest : public DtexecJobTest {
 protected:
  std::unique_ptr<LaunchProcess> launch_plain(const std::string& name, int steps,
                                              const std::map<std::string, std::string>& env) {
    std::vector<std::string> options{"--nproc",
                                     "4",
                                     "--run-dir",
                                     dir() + "/" + name + ".run",
                                     "--",
                                     dtexec_path(),
                                     "train",
                                     "--model",
                                     tiny_model(),
                                     "--plan",
                                     "auto",
                                     "--data",
                                     "synthetic",
                                     "--steps",
                                     std::to_string(steps)};
    return std::make_unique<LaunchProcess>(options, env, dir() + "/" + name);
  }
};

TEST_F(StragglerJobTest, ARankSlowedOnPurposeIsNamedWithinAFewSteps) {
  // Rank 2 sleeps 0.25 s at the start of every step (DTRAIN_TEST_SLOW_RANKS): its peers wait for it in the
  // gradient all-reduce, so every rank's step is slow, but only rank 2's own work is.
  auto p = launch_plain("slow", 8, {{"DTRAIN_TEST_SLOW_RANKS", "2:0.25"}});
  ASSERT_EQ(p->wait(120s), 0) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("rank 2 on node 0 is a straggler"));
  auto found = events_named_in("slow", "straggler");
  ASSERT_EQ(found.size(), 1u) << "one episode, reported once: " << p->err();
  EXPECT_EQ(found[0]["rank"], 2);
  EXPECT_EQ(found[0]["episode"], "start");
  EXPECT_LE(found[0]["last_step"].get<int>(), 5) << "named within a few steps";
  // Its own work holds the 0.25 s sleep; its peers' does not (their work alone varies with the machine's load).
  EXPECT_GT(found[0]["busy_s"].get<double>(), 0.25);
  EXPECT_GT(found[0]["busy_s"].get<double>() - found[0]["peers_busy_s"].get<double>(), 0.15);
}

TEST_F(StragglerJobTest, ABalancedRunReportsNoStraggler) {
  auto p = launch_plain("balanced", 20, {});
  ASSERT_EQ(p->wait(120s), 0) << p->err();
  EXPECT_THAT(p->err(), Not(HasSubstr("straggler")));
  EXPECT_TRUE(events_named_in("balanced", "straggler").empty());
}

TEST_F(StragglerJobTest, AMalformedTestDelayIsAnInputError) {
  auto p = launch_plain("malformed", 2, {{"DTRAIN_TEST_SLOW_RANKS", "2=0.25"}});
  EXPECT_NE(p->wait(120s), 0);
  EXPECT_THAT(p->err(), HasSubstr("DTRAIN_TEST_SLOW_RANKS: '2=0.25' is not RANK:SECONDS"));
}

TEST_F(DtexecJobTest, PreemptedJobCheckpointsCleanlyAndResumesBitwise) {
  const auto expected = reference();
  // No periodic checkpoint: the one written on SIGTERM is the only one.
  auto p = launch_dtexec("preempted", {"--nproc", "4"}, 1000);
  ASSERT_TRUE(wait_for_step("preempted", kSteps / 4, 120s)) << p->err();
  p->signal(SIGTERM);
  ASSERT_EQ(p->wait(60s), 10) << p->err();
  // Every rank finished its step, took part in the checkpoint and exited 10 (dtexec's preemption code).
  auto exits = events_named_in("preempted", "rank_exit");
  ASSERT_EQ(exits.size(), 4u);
  for (const auto& e : exits) EXPECT_EQ(e["exit_code"], 10) << e.dump();
  EXPECT_TRUE(events_named_in("preempted", "decision").empty()) << "a preempted job must not restart";
  const int stopped_at = steps_written("preempted").back();
  EXPECT_LT(stopped_at, kSteps);
  EXPECT_TRUE(std::filesystem::exists(dir() + "/preempted.ckpt/" + fmt_step(stopped_at) + "/metadata.json"))
      << "no complete checkpoint of step " << stopped_at;
  // The job submitted again (as Slurm requeues it) resumes from that checkpoint and ends as if never stopped.
  auto again = launch_dtexec("preempted", {"--nproc", "4"}, 1000);
  ASSERT_EQ(again->wait(120s), 0) << again->err();
  auto steps = steps_written("preempted");
  auto resumed = std::adjacent_find(steps.begin(), steps.end(), [](int a, int b) { return b <= a; });
  EXPECT_EQ(resumed, steps.end()) << "steps were repeated: the resumed job did not start after the checkpoint";
  auto got = losses("preempted");
  EXPECT_EQ(differences(got, expected), "");
  expect_job_ends_at_the_last_step(got);
}

}  // namespace
}  // namespace dtrain::launch::testing
