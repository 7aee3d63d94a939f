// dtlaunch end to end with fake_rank as the rank program: the environment contract, binding, output merging, and
// the failure policy (kill -9, SIGSTOP, non-zero exits, exhausted restarts, preemption, a lost node, mismatched
// nodes). Every test checks at its end that none of its processes is left (LaunchTest::TearDown).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "dtrain/common/strings.h"
#include "launch_harness.h"

namespace dtrain::launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::set<int> parse_cpu_list(const std::string& text) {
  std::set<int> cpus;
  for (const std::string& part : split(text, ',')) {
    if (part.empty()) continue;
    auto dash = part.find('-');
    int lo = std::stoi(part.substr(0, dash));
    int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) cpus.insert(c);
  }
  return cpus;
}

TEST_F(LaunchTest, EveryRankSeesTheEnvironmentContract) {
  auto p = launch({"--nproc", "3"}, {"--store-barrier"});
  ASSERT_EQ(p->wait(), 0) << p->err();
  std::set<std::string> run_ids, tokens, stores;
  for (int r = 0; r < 3; ++r) {
    auto rec = rank_record(r, 0);
    auto env = rec["env"];
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["DTRAIN_STORE"], "127.0.0.1:" + env["MASTER_PORT"].get<std::string>());
    EXPECT_EQ(env["DTRAIN_COMM_HOST"], "127.0.0.1");
    EXPECT_EQ(env["DTRAIN_NODE_RANK"], "0");
    EXPECT_EQ(env["DTRAIN_NNODES"], "1");
    EXPECT_EQ(env["DTRAIN_HEARTBEAT_FD"], "3");
    EXPECT_TRUE(rec["heartbeat_fd_open"].get<bool>());
    EXPECT_EQ(env["DTRAIN_RESTART"], "0");
    EXPECT_TRUE(env.contains("DTRAIN_HEARTBEAT_INTERVAL"));
    EXPECT_TRUE(env.contains("OMP_NUM_THREADS"));
    EXPECT_EQ(env["DTRAIN_STORE_TOKEN"].get<std::string>().size(), 64u);
    run_ids.insert(env["DTRAIN_RUN_ID"]);
    tokens.insert(env["DTRAIN_STORE_TOKEN"]);
    stores.insert(env["DTRAIN_STORE"]);
    // Its own process group.
    EXPECT_EQ(rec["pgid"], rec["pid"]);
  }
  EXPECT_EQ(run_ids.size(), 1u);
  EXPECT_EQ(tokens.size(), 1u);
  EXPECT_EQ(stores.size(), 1u);
  // The secret is in the ranks' environment and nowhere in dtlaunch's output.
  EXPECT_THAT(p->out() + p->err(), Not(HasSubstr(*tokens.begin())));
}

TEST_F(LaunchTest, InheritedTokenIsPassedOnAndNeverPrinted) {
  const std::string token = "inherited-secret-" + tag();
  auto p = launch({"--nproc", "2"}, {"--store-barrier"}, {{"DTRAIN_STORE_TOKEN", token}, {"DTRAIN_LOG", "trace"}});
  ASSERT_EQ(p->wait(), 0) << p->err();
  EXPECT_EQ(rank_record(1, 0)["env"]["DTRAIN_STORE_TOKEN"], token);
  EXPECT_THAT(p->out() + p->err(), Not(HasSubstr(token)));
  for (const auto& e : events()) EXPECT_THAT(e.dump(), Not(HasSubstr(token)));
}

TEST_F(LaunchTest, RanksGetDisjointCpuSets) {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 2) GTEST_SKIP() << "this machine has one CPU: no two disjoint CPU sets to check";
  const int n = static_cast<int>(std::min(cpus, 4L));
  auto p = launch({"--nproc", std::to_string(n)}, {});
  ASSERT_EQ(p->wait(), 0) << p->err();
  std::set<int> seen;
  for (int r = 0; r < n; ++r) {
    std::set<int> mine = parse_cpu_list(rank_record(r, 0)["cpus"]);
    ASSERT_FALSE(mine.empty());
    for (int c : mine) EXPECT_TRUE(seen.insert(c).second) << "CPU " << c << " given to two ranks";
  }
}

TEST_F(LaunchTest, NoBindLeavesAffinityAlone) {
  auto p = launch({"--nproc", "2", "--no-bind"}, {});
  ASSERT_EQ(p->wait(), 0) << p->err();
  EXPECT_EQ(rank_record(0, 0)["cpus"], rank_record(1, 0)["cpus"]);
}

TEST_F(LaunchTest, OutputIsPrefixedAndLinesNeverInterleave) {
  const int n = 4, lines = 300;
  auto p = launch({"--nproc", std::to_string(n)}, {"--print-lines", std::to_string(lines)});
  ASSERT_EQ(p->wait(), 0) << p->err();
  const std::regex out_line(R"(\[rank (\d+)\] line (\d+) of rank (\d+) x+)");
  const std::regex err_line(R"(\[rank (\d+)\] err line (\d+) of rank (\d+) x+)");
  std::map<int, int> out_count, err_count;
  for (const auto& l : lines_of(p->out())) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, out_line)) << "mangled stdout line: " << l;
    EXPECT_EQ(m[1], m[3]);
    EXPECT_EQ(std::stoi(m[2]), out_count[std::stoi(m[1])]++) << "lines of one rank out of order";
  }
  for (const auto& l : lines_of(p->err())) {
    std::smatch m;
    if (l.rfind("dtlaunch", 0) == 0) continue;  // the agent's own log
    ASSERT_TRUE(std::regex_match(l, m, err_line)) << "mangled stderr line: " << l;
    EXPECT_EQ(m[1], m[3]);
    ++err_count[std::stoi(m[1])];
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out_count[r], lines) << "rank " << r;
    EXPECT_EQ(err_count[r], lines) << "rank " << r;
  }
}

TEST_F(LaunchTest, ProgressLineFromRankZero) {
  auto p = launch({"--nproc", "2", "--progress-interval", "0"}, {"--heartbeat", "--steps", "6", "--step-ms", "20"});
  ASSERT_EQ(p->wait(), 0) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("step 6/6 (100.0%)  loss 0.1667  1.00k tokens/s"));
  auto progress = events_named("progress");
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back()["step"], 6);
  EXPECT_EQ(progress.back()["total_steps"], 6);
  EXPECT_DOUBLE_EQ(progress.back()["loss"].get<double>(), 1.0 / 6.0);
  EXPECT_DOUBLE_EQ(progress.back()["tokens_per_s"].get<double>(), 1000.0);
}

TEST_F(LaunchTest, KillNineOfARankRestartsTheJob) {
  auto p =
      launch({"--nproc", "3", "--max-restarts", "2"}, {"--heartbeat", "--steps", "30", "--step-ms", "40", "--resume"});
  ASSERT_TRUE(wait_for_ranks(0, 2, 0));
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(wait_for_checkpoint(r, 3));
  const pid_t victim = rank_record(1, 0)["pid"];
  const std::string first_run_id = rank_record(0, 0)["env"]["DTRAIN_RUN_ID"];
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_EQ(p->wait(), 0) << p->err();
  // One restart: every rank ran twice, with DTRAIN_RESTART=1 and a new run id, and resumed from its checkpoint.
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(has_rank_file(r, 1)) << "rank " << r << " was not restarted";
    EXPECT_FALSE(has_rank_file(r, 2));
    auto rec = rank_record(r, 1);
    EXPECT_EQ(rec["env"]["DTRAIN_RESTART"], "1");
    EXPECT_NE(rec["env"]["DTRAIN_RUN_ID"], first_run_id);
    EXPECT_GE(rec["resumed_from"].get<long>(), 3) << "rank " << r << " did not resume from its checkpoint";
    EXPECT_EQ(checkpoint_of(r), 30);
  }
  EXPECT_THAT(p->err(), HasSubstr("rank 1 on node 0 (pid " + std::to_string(victim) +
                                  ") killed by signal 9 (SIGKILL): stopping every rank of the job"));
  EXPECT_THAT(p->err(), HasSubstr("restart 1 of 2 (DTRAIN_RESTART=1)"));
  auto decisions = events_named("decision");
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_EQ(decisions[0]["verdict"], "restart");
  EXPECT_EQ(decisions[0]["restarts"], 1);
  auto ends = events_named("end");
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[0]["kind"], "failure");
  EXPECT_EQ(ends[0]["rank"], 1);
  EXPECT_EQ(ends[1]["kind"], "success");
}

TEST_F(LaunchTest, StoppedRankIsDetectedWithinTheHeartbeatTimeoutAndRestarted) {
  auto p = launch({"--nproc", "2", "--heartbeat-timeout", "1", "--max-restarts", "1"},
                  {"--heartbeat", "--steps", "60", "--step-ms", "50", "--resume"});
  ASSERT_TRUE(wait_for_ranks(0, 1, 0));
  ASSERT_TRUE(wait_for_checkpoint(0, 2));
  const pid_t victim = rank_record(0, 0)["pid"];
  const auto stopped_at = Clock::now();
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  // Detected (the end of attempt 0 recorded) within the timeout plus the heartbeat interval and polling slack.
  const auto deadline = stopped_at + 5s;
  while (events_named("end").empty() && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  const double detected_s = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  ASSERT_FALSE(events_named("end").empty()) << p->err();
  // The last beat came at most one interval (0.2 s) before the stop; the agent checks every 50 ms.
  EXPECT_LT(detected_s, 1.0 + 0.75) << "SIGSTOP detected after " << detected_s << " s";
  EXPECT_GE(detected_s, 1.0 - 0.2 - 0.05);
  ASSERT_EQ(p->wait(), 0) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("rank 0 on node 0 (pid " + std::to_string(victim) + ") sent no heartbeat for"));
  EXPECT_TRUE(has_rank_file(0, 1));
  EXPECT_TRUE(has_rank_file(1, 1));
  // The stopped process was killed and reaped (TearDown checks no process is left).
}

TEST_F(LaunchTest, NonZeroExitRestarts) {
  auto p = launch({"--nproc", "3"}, {"--steps", "5", "--step-ms", "10", "--resume", "--fail", "2:0:3:exit=42"});
  ASSERT_EQ(p->wait(), 0) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("rank 2 on node 0"));
  EXPECT_THAT(p->err(), HasSubstr("exited with code 42"));
  EXPECT_THAT(p->err(), HasSubstr("restart 1 of 3"));
  EXPECT_TRUE(has_rank_file(2, 1));
  EXPECT_FALSE(has_rank_file(2, 2));
}

TEST_F(LaunchTest, RestartsExhaustedExitsNine) {
  auto p =
      launch({"--nproc", "2", "--max-restarts", "2"}, {"--steps", "5", "--step-ms", "10", "--fail", "1:*:2:signal=6"});
  EXPECT_EQ(p->wait(), 9) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("the job failed after using all 2 of its restarts (--max-restarts 2); last failure: "
                                  "rank 1 on node 0"));
  EXPECT_THAT(p->err(), HasSubstr("killed by signal 6 (SIGABRT)"));
  for (int attempt = 0; attempt <= 2; ++attempt) EXPECT_TRUE(has_rank_file(1, attempt)) << attempt;
  EXPECT_FALSE(has_rank_file(1, 3));
  auto decisions = events_named("decision");
  ASSERT_EQ(decisions.size(), 3u);
  EXPECT_EQ(decisions[0]["verdict"], "restart");
  EXPECT_EQ(decisions[1]["verdict"], "restart");
  EXPECT_EQ(decisions[1]["restarts"], 2);
  EXPECT_EQ(decisions[2]["verdict"], "exhausted");
  EXPECT_EQ(events_named("exit").back()["exit_code"], 9);
}

TEST_F(LaunchTest, ZeroRestartsFailsAtTheFirstFailure) {
  auto p =
      launch({"--nproc", "2", "--max-restarts", "0"}, {"--steps", "3", "--step-ms", "10", "--fail", "0:0:1:exit=1"});
  EXPECT_EQ(p->wait(), 9) << p->err();
  EXPECT_FALSE(has_rank_file(0, 1));
}

TEST_F(LaunchTest, ExitCodeThatARestartCannotFixEndsTheJob) {
  auto p = launch({"--nproc", "2"}, {"--steps", "3", "--step-ms", "10", "--fail", "1:0:1:exit=5"});
  EXPECT_EQ(p->wait(), 5) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("not restarting, since exit code 5 means a restart cannot fix it"));
  EXPECT_FALSE(has_rank_file(1, 1));
}

TEST_F(LaunchTest, HungRankIsCaughtByTheProgressTimeout) {
  auto p = launch({"--nproc", "2", "--progress-timeout", "0.5"},
                  {"--heartbeat", "--steps", "8", "--step-ms", "20", "--resume", "--fail", "1:0:3:hang"});
  ASSERT_EQ(p->wait(), 0) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("rank 1 on node 0"));
  EXPECT_THAT(p->err(), HasSubstr("reported no training step for"));
  EXPECT_TRUE(has_rank_file(1, 1));
}

TEST_F(LaunchTest, SigtermIsForwardedAndExitsTen) {
  auto p = launch({"--nproc", "3"}, {"--heartbeat", "--steps", "1000", "--step-ms", "20"});
  ASSERT_TRUE(wait_for_ranks(0, 2, 0));
  p->signal(SIGTERM);
  EXPECT_EQ(p->wait(10s), 10) << p->err();
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(std::filesystem::exists(dir() + "/term.rank" + std::to_string(r) + ".attempt0"))
        << "rank " << r << " never saw SIGTERM";
  }
  EXPECT_THAT(p->err(), HasSubstr("preempted (dtlaunch on node 0 received SIGTERM)"));
  EXPECT_FALSE(has_rank_file(0, 1));
}

TEST_F(LaunchTest, SigintIsForwardedToo) {
  auto p = launch({"--nproc", "2"}, {"--steps", "1000", "--step-ms", "20"});
  ASSERT_TRUE(wait_for_ranks(0, 1, 0));
  p->signal(SIGINT);
  EXPECT_EQ(p->wait(10s), 10) << p->err();
}

TEST_F(LaunchTest, RankIgnoringSigtermIsKilledAfterThePreemptGrace) {
  auto p = launch({"--nproc", "2", "--preempt-grace", "0.5"}, {"--on-term", "ignore", "--steps", "1000"});
  ASSERT_TRUE(wait_for_ranks(0, 1, 0));
  const auto t0 = Clock::now();
  p->signal(SIGTERM);
  EXPECT_EQ(p->wait(10s), 10) << p->err();
  EXPECT_LT(std::chrono::duration<double>(p->ended() - t0).count(), 3.0);
  EXPECT_THAT(p->err(), HasSubstr("still running after the grace period: SIGKILL"));
  EXPECT_THAT(p->err(), HasSubstr("did not stop cleanly: killed by signal 9 (SIGKILL)"));
}

TEST_F(LaunchTest, SecondSignalKillsAtOnce) {
  auto p = launch({"--nproc", "2"}, {"--on-term", "ignore", "--steps", "1000"});
  ASSERT_TRUE(wait_for_ranks(0, 1, 0));
  p->signal(SIGTERM);
  std::this_thread::sleep_for(200ms);
  p->signal(SIGTERM);
  EXPECT_EQ(p->wait(5s), 10) << p->err();
  EXPECT_THAT(p->err(), HasSubstr("again: killing every rank now"));
}

TEST_F(LaunchTest, ChildrenOfRanksDoNotSurvive) {
  auto p = launch({"--nproc", "2"}, {"--grandchild"});
  ASSERT_EQ(p->wait(), 0) << p->err();
  for (int r = 0; r < 2; ++r) {
    const pid_t grandchild = rank_record(r, 0)["grandchild"];
    EXPECT_NE(::kill(grandchild, 0), 0) << "the child of rank " << r << " survived";
  }
}

TEST_F(LaunchTest, RanksDieWithAnAgentKilledByKillNine) {
  auto p = launch({"--nproc", "3"}, {"--heartbeat", "--steps", "1000", "--step-ms", "20"});
  ASSERT_TRUE(wait_for_ranks(0, 2, 0));
  p->signal(SIGKILL);
  EXPECT_EQ(p->wait(), 128 + SIGKILL);
  // TearDown checks that the ranks are gone: the parent-death signal killed them.
}

TEST_F(LaunchTest, MissingCommandIsBadUsage) {
  auto p = std::make_unique<LaunchProcess>(std::vector<std::string>{"--nproc", "2", "--", "no-such-program-" + tag()},
                                           std::map<std::string, std::string>{}, dir() + "/node0");
  EXPECT_EQ(p->wait(), 2);
  EXPECT_THAT(p->err(), HasSubstr("command 'no-such-program-" + tag() + "' not found in PATH"));
}

TEST_F(LaunchTest, SeveralNodesNeedAToken) {
  auto p = launch({"--nnodes", "2", "--node-rank", "1", "--rdzv", "127.0.0.1:1", "--nproc", "1"}, {});
  EXPECT_EQ(p->wait(), 2);
  EXPECT_THAT(p->err(), HasSubstr("DTRAIN_STORE_TOKEN is not set: the 2 nodes of a job need one shared secret"));
}

// --- two agents on this machine: nodes 0 and 1 ---------------------------------------------------------------------

class TwoNodeTest : public LaunchTest {
 protected:
  std::map<std::string, std::string> token_env() const { return {{"DTRAIN_STORE_TOKEN", "two-node-" + tag()}}; }
  std::vector<std::string> node_options(int node, int nproc, std::uint16_t port,
                                        std::vector<std::string> extra = {}) const {
    std::vector<std::string> o{"--nnodes",         "2",
                               "--node-rank",      std::to_string(node),
                               "--rdzv",           "127.0.0.1:" + std::to_string(port),
                               "--nproc-per-node", std::to_string(nproc)};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  }
};

TEST_F(TwoNodeTest, RanksAreNumberedAcrossNodes) {
  const auto port = free_port();
  auto n1 = launch(node_options(1, 2, port), {"--store-barrier"}, token_env(), "node1");
  auto n0 = launch(node_options(0, 2, port), {"--store-barrier"}, token_env(), "node0");
  ASSERT_EQ(n0->wait(), 0) << n0->err();
  ASSERT_EQ(n1->wait(), 0) << n1->err();
  std::set<std::string> run_ids;
  for (int r = 0; r < 4; ++r) {
    auto env = rank_record(r, 0)["env"];
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(r % 2));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["DTRAIN_NODE_RANK"], std::to_string(r / 2));
    EXPECT_EQ(env["DTRAIN_NNODES"], "2");
    EXPECT_EQ(env["DTRAIN_STORE"], "127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(env["MASTER_PORT"], std::to_string(port));
    EXPECT_EQ(env["DTRAIN_COMM_HOST"], "127.0.0.1");
    run_ids.insert(env["DTRAIN_RUN_ID"]);
  }
  EXPECT_EQ(run_ids.size(), 1u);
}

TEST_F(TwoNodeTest, AFailureOnOneNodeRestartsBothAndCountsOnce) {
  const auto port = free_port();
  const std::vector<std::string> rank_args{"--heartbeat", "--steps",  "8",      "--step-ms",
                                           "30",          "--resume", "--fail", "3:0:2:exit=1"};
  auto n0 = launch(node_options(0, 2, port, {"--max-restarts", "1"}), rank_args, token_env(), "node0");
  auto n1 = launch(node_options(1, 2, port, {"--max-restarts", "1"}), rank_args, token_env(), "node1");
  ASSERT_EQ(n0->wait(), 0) << n0->err();
  ASSERT_EQ(n1->wait(), 0) << n1->err();
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(has_rank_file(r, 1)) << "rank " << r << " not restarted";
  for (int node = 0; node < 2; ++node) {
    auto decisions = events_named("decision", node);
    ASSERT_EQ(decisions.size(), 1u) << "node " << node;
    EXPECT_EQ(decisions[0]["verdict"], "restart");
    EXPECT_EQ(decisions[0]["restarts"], 1);
  }
  EXPECT_THAT(n0->err(), HasSubstr("rank 3 on node 1"));
}

TEST_F(TwoNodeTest, ExhaustedRestartsAreCountedForTheWholeJob) {
  // Failures alternate between the nodes: a per-node budget of 1 would allow 2 restarts; the job's budget is 1.
  const auto port = free_port();
  const std::vector<std::string> rank_args{"--steps",      "5",      "--step-ms",    "20",     "--fail",
                                           "0:0:2:exit=1", "--fail", "2:1:2:exit=1", "--fail", "0:2:2:exit=1"};
  auto n0 = launch(node_options(0, 2, port, {"--max-restarts", "1"}), rank_args, token_env(), "node0");
  auto n1 = launch(node_options(1, 2, port, {"--max-restarts", "1"}), rank_args, token_env(), "node1");
  EXPECT_EQ(n0->wait(), 9) << n0->err();
  EXPECT_EQ(n1->wait(), 9) << n1->err();
  EXPECT_FALSE(has_rank_file(0, 2));
  EXPECT_THAT(n1->err(), HasSubstr("the job failed after using all 1 of its restarts"));
}

TEST_F(TwoNodeTest, KilledAgentOfNodeOneFailsNodeZeroWithinTenSeconds) {
  const auto port = free_port();
  const std::vector<std::string> rank_args{"--heartbeat", "--steps", "100000", "--step-ms", "20"};
  auto n0 = launch(node_options(0, 2, port), rank_args, token_env(), "node0");
  auto n1 = launch(node_options(1, 2, port), rank_args, token_env(), "node1");
  ASSERT_TRUE(wait_for_ranks(0, 3, 0)) << n0->err() << n1->err();
  const auto killed_at = Clock::now();
  n1->signal(SIGKILL);
  EXPECT_EQ(n1->wait(), 128 + SIGKILL);
  EXPECT_EQ(n0->wait(15s), 8) << n0->err();
  const double took = std::chrono::duration<double>(n0->ended() - killed_at).count();
  EXPECT_LT(took, 10.0) << "node 0 took " << took << " s to give up";
  EXPECT_THAT(n0->err(), HasSubstr("node 1's dtlaunch stopped responding"));
  std::printf("node 0 exited %.2f s after node 1's agent was killed\n", took);
}

TEST_F(TwoNodeTest, KilledAgentOfNodeZeroFailsNodeOne) {
  const auto port = free_port();
  const std::vector<std::string> rank_args{"--heartbeat", "--steps", "100000", "--step-ms", "20"};
  auto n0 = launch(node_options(0, 1, port), rank_args, token_env(), "node0");
  auto n1 = launch(node_options(1, 1, port), rank_args, token_env(), "node1");
  ASSERT_TRUE(wait_for_ranks(0, 1, 0)) << n0->err() << n1->err();
  const auto killed_at = Clock::now();
  n0->signal(SIGKILL);
  EXPECT_EQ(n1->wait(15s), 8) << n1->err();
  const double took = std::chrono::duration<double>(n1->ended() - killed_at).count();
  EXPECT_LT(took, 10.0);
  EXPECT_THAT(n1->err(), HasSubstr("lost the job's store at 127.0.0.1:" + std::to_string(port)));
}

TEST_F(TwoNodeTest, SigtermToOneAgentPreemptsEveryNode) {
  const auto port = free_port();
  const std::vector<std::string> rank_args{"--heartbeat", "--steps", "100000", "--step-ms", "20"};
  auto n0 = launch(node_options(0, 2, port), rank_args, token_env(), "node0");
  auto n1 = launch(node_options(1, 2, port), rank_args, token_env(), "node1");
  ASSERT_TRUE(wait_for_ranks(0, 3, 0));
  n1->signal(SIGTERM);
  EXPECT_EQ(n0->wait(10s), 10) << n0->err();
  EXPECT_EQ(n1->wait(10s), 10) << n1->err();
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(std::filesystem::exists(dir() + "/term.rank" + std::to_string(r) + ".attempt0")) << r;
  }
}

TEST_F(TwoNodeTest, DifferentRanksPerNodeFailEveryNode) {
  const auto port = free_port();
  auto n0 = launch(node_options(0, 2, port), {}, token_env(), "node0");
  auto n1 = launch(node_options(1, 3, port), {}, token_env(), "node1");
  EXPECT_EQ(n0->wait(), 2) << n0->err();
  EXPECT_EQ(n1->wait(), 2) << n1->err();
  for (const auto* p : {n0.get(), n1.get()}) {
    EXPECT_THAT(p->err(), HasSubstr("starts 3 ranks (--nproc-per-node 3) but node 0"));
    EXPECT_THAT(p->err(), HasSubstr("starts 2: the world size would be 6 on one and 4 on the other"));
  }
  EXPECT_FALSE(has_rank_file(0, 0));
}

TEST_F(TwoNodeTest, DifferentNodeCountsFailEveryNode) {
  const auto port = free_port();
  auto n0 = launch(node_options(0, 1, port), {}, token_env(), "node0");
  auto o1 = node_options(1, 1, port);
  o1[1] = "3";  // --nnodes 3
  auto n1 = launch(o1, {}, token_env(), "node1");
  EXPECT_EQ(n0->wait(), 2) << n0->err();
  EXPECT_EQ(n1->wait(), 2) << n1->err();
  EXPECT_THAT(n0->err(), HasSubstr("was started for 3 nodes but node 0"));
  EXPECT_THAT(n1->err(), HasSubstr("was started for 3 nodes but node 0"));
}

TEST_F(TwoNodeTest, WrongTokenNeverJoins) {
  const auto port = free_port();
  auto n0 = launch(node_options(0, 1, port), {"--steps", "1000"}, token_env(), "node0");
  auto n1 = launch(node_options(1, 1, port, {"--rdzv-timeout", "1"}), {}, {{"DTRAIN_STORE_TOKEN", "wrong"}}, "node1");
  EXPECT_EQ(n1->wait(), 8) << n1->err();
  EXPECT_THAT(n1->err(), HasSubstr("no store of this job answered at 127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(n1->err(), HasSubstr("authentication rejected"));
  n0->signal(SIGTERM);
  EXPECT_EQ(n0->wait(), 10) << n0->err();
}

TEST_F(TwoNodeTest, NodeRankClaimedTwiceFails) {
  const auto port = free_port();
  auto n0 = launch(node_options(0, 1, port), {"--steps", "1000"}, token_env(), "node0");
  auto a = launch(node_options(1, 1, port), {"--steps", "1000"}, token_env(), "node1a");
  auto b = launch(node_options(1, 1, port), {"--steps", "1000"}, token_env(), "node1b");
  EXPECT_EQ(n0->wait(), 2) << n0->err();
  EXPECT_EQ(a->wait(), 2) << a->err();
  EXPECT_EQ(b->wait(), 2) << b->err();
  EXPECT_THAT(n0->err(), HasSubstr("node rank 1 is claimed by two agents"));
}

}  // namespace
}  // namespace dtrain::launch::testing
