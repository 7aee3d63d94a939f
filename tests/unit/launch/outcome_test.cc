// The outcome protocol (dtrain/launch/outcome.h) over a real store: a Server in this process on loopback and one
// Client per simulated node, with a thread per node where they race, as the node agents do.
#include "dtrain/launch/outcome.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <thread>
#include <vector>

#include "dtrain/common/error.h"
#include "dtrain/store/client.h"
#include "dtrain/store/server.h"

namespace dtrain::launch {
namespace {

using ::testing::HasSubstr;

class OutcomeStore : public ::testing::Test {
 protected:
  void SetUp() override {
    store::ServerOptions so;
    so.bind_address = "127.0.0.1";
    server_ = std::make_unique<store::Server>(secret_, so);
  }
  // One node's connection to the job's store.
  std::unique_ptr<store::Client> node_client() {
    return std::make_unique<store::Client>(store::Endpoint{"127.0.0.1", server_->port()}, secret_);
  }
  // `nodes` clients, each used by its own thread running fn(node, client); joined before returning.
  template <typename Fn>
  void each_node(int nodes, Fn fn) {
    std::vector<std::unique_ptr<store::Client>> clients;
    for (int n = 0; n < nodes; ++n) clients.push_back(node_client());
    std::vector<std::thread> threads;
    for (int n = 0; n < nodes; ++n) threads.emplace_back([&, n] { fn(n, *clients[n]); });
    for (auto& t : threads) t.join();
  }

  store::Secret secret_ = store::Secret::generate();
  std::unique_ptr<store::Server> server_;
};

ProcessExit exited(int code) { return ProcessExit::from_wait_status(code << 8); }

TEST(OutcomeWords, RoundTripAndUnknownWordsAreRejected) {
  for (EndKind k : {EndKind::kSuccess, EndKind::kFailure, EndKind::kPreempted, EndKind::kFatal}) {
    EXPECT_EQ(parse_end_kind(to_string(k)), k);
  }
  for (Verdict v : {Verdict::kRestart, Verdict::kExhausted, Verdict::kFatal, Verdict::kPreempted}) {
    EXPECT_EQ(parse_verdict(to_string(v)), v);
  }
  EXPECT_EQ(to_string(EndKind::kFailure), "failure");
  EXPECT_EQ(to_string(Verdict::kRestart), "restart");
  try {
    parse_end_kind("exploded");
    FAIL() << "parsed";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kComm);
    EXPECT_THAT(e.what(), HasSubstr("unknown end kind 'exploded' (expected success, failure, preempted or fatal"));
  }
  EXPECT_THROW(parse_verdict("Restart"), Error);
}

TEST(OutcomeRecords, JsonRoundTrip) {
  EndRecord e{EndKind::kFailure, 1, 5, "rank 5 on node 1 (pid 77) exited with code 3", 3, true};
  EndRecord f = EndRecord::from_json(e.to_json());
  EXPECT_EQ(f.kind, EndKind::kFailure);
  EXPECT_EQ(f.to_json(), e.to_json());
  EXPECT_THAT(e.to_json(), HasSubstr(R"("kind":"failure")"));
  Decision d{Verdict::kExhausted, 4, 0, "", {}};
  EXPECT_EQ(Decision::from_json(d.to_json()).verdict, Verdict::kExhausted);
  EXPECT_EQ(Decision::from_json(d.to_json()).restarts, 4);
}

TEST(OutcomeRecords, UnreadableRecordsAreRejectedOrBecomeFatal) {
  const std::string unknown = R"({"kind":"exploded","node":0,"rank":-1,"reason":"","exit_code":0,"permanent":false})";
  EXPECT_THROW(EndRecord::from_json(unknown), Error);
  EXPECT_THROW(EndRecord::from_json("not json"), Error);
  EXPECT_THROW(EndRecord::from_json(R"({"kind":"success"})"), Error);
  EXPECT_THROW(Decision::from_json(R"({"verdict":"retry","restarts":1,"exit_code":0,"reason":""})"), Error);
  EndRecord r = read_end(unknown);
  EXPECT_EQ(r.kind, EndKind::kFatal);
  EXPECT_EQ(r.exit_code, static_cast<int>(ExitCode::kFailure));
  EXPECT_THAT(r.reason, HasSubstr("unreadable end record in the store (unknown end kind 'exploded'"));
  Decision d = read_decision("{}");
  EXPECT_EQ(d.verdict, Verdict::kFatal);
  EXPECT_THAT(d.reason, HasSubstr("unreadable decision in the store"));
}

TEST(OutcomeRankExit, ExitCodesComeFromExitCode) {
  EndRecord preempted = end_of_rank_exit(1, 5, 77, exited(static_cast<int>(ExitCode::kPreempted)));
  EXPECT_EQ(preempted.kind, EndKind::kPreempted);
  EXPECT_EQ(preempted.reason, "rank 5 on node 1 exited with code 10 (it was told to stop)");
  EXPECT_EQ(preempted.exit_code, 10);
  EndRecord permanent = end_of_rank_exit(1, 5, 77, exited(static_cast<int>(ExitCode::kDataExhausted)));
  EXPECT_EQ(permanent.kind, EndKind::kFailure);
  EXPECT_TRUE(permanent.permanent);
  EXPECT_EQ(permanent.exit_code, 6);
  EXPECT_EQ(permanent.reason, "rank 5 on node 1 (pid 77) exited with code 6");
  EndRecord transient = end_of_rank_exit(0, 2, 9, exited(42));
  EXPECT_FALSE(transient.permanent);
  EXPECT_EQ(transient.exit_code, 0);
  EndRecord killed = end_of_rank_exit(0, 2, 9, ProcessExit::from_wait_status(SIGKILL));
  EXPECT_EQ(killed.kind, EndKind::kFailure);
  EXPECT_FALSE(killed.permanent);
  EXPECT_EQ(killed.reason, "rank 2 on node 0 (pid 9) killed by signal 9 (SIGKILL)");
  for (int code = 0; code <= 10; ++code) {
    EXPECT_EQ(is_permanent_exit_code(code), code >= 2 && code <= 7) << code;
  }
  EXPECT_FALSE(is_permanent_exit_code(42));
}

TEST(OutcomeExitCodes, BeforeStartAndAfterDecisions) {
  EXPECT_EQ(exit_code_before_start(std::nullopt, std::nullopt), 1);
  EXPECT_EQ(exit_code_before_start(EndRecord{EndKind::kPreempted, 0, -1, "", 10, false}, std::nullopt), 10);
  EXPECT_EQ(exit_code_before_start(EndRecord{EndKind::kFatal, 0, -1, "", 5, false}, std::nullopt), 5);
  EXPECT_EQ(exit_code_before_start(EndRecord{EndKind::kFailure, 0, 1, "", 0, false}, std::nullopt), 1);
  EXPECT_EQ(exit_code_of(Decision{Verdict::kExhausted, 3, 0, "", {}}), 9);
  EXPECT_EQ(exit_code_of(Decision{Verdict::kPreempted, 0, 0, "", {}}), 10);
  EXPECT_EQ(exit_code_of(Decision{Verdict::kFatal, 0, 8, "", {}}), 8);
}

TEST_F(OutcomeStore, FirstEndWinsForEveryNode) {
  constexpr int kNodes = 3;
  std::vector<AttemptRecords::RecordedEnd> seen(kNodes);
  each_node(kNodes, [&](int node, store::Client& client) {
    AttemptRecords records(client, 0);
    seen[node] = records.record_end(end_of_rank_exit(node, node * 4, 100 + node, exited(1)));
  });
  int winners = 0;
  for (int node = 0; node < kNodes; ++node) {
    winners += seen[node].won ? 1 : 0;
    EXPECT_EQ(seen[node].end.to_json(), seen[0].end.to_json()) << "node " << node;
    if (seen[node].won) {
      EXPECT_EQ(seen[node].end.node, node);
    }
  }
  EXPECT_EQ(winners, 1);
}

TEST_F(OutcomeStore, SuccessWhenTheLastNodeFinishes) {
  constexpr int kNodes = 3;
  std::vector<int> last(kNodes, 0);
  each_node(kNodes,
            [&](int node, store::Client& client) { last[node] = AttemptRecords(client, 0).node_finished(kNodes); });
  EXPECT_EQ(last[0] + last[1] + last[2], 1);
}

// Two nodes finish, the third's rank fails: the failing node records the end and decides; the budget of one restart
// allows attempt 1, whose failure exhausts it.
TEST_F(OutcomeStore, OneNodeFailsAndDecidesForTheJob) {
  constexpr int kNodes = 3;
  constexpr int kMaxRestarts = 1;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::vector<std::optional<Decision>> decided(kNodes);
    each_node(kNodes, [&](int node, store::Client& client) {
      AttemptRecords records(client, attempt);
      if (node != 1) {
        EXPECT_FALSE(records.node_finished(kNodes));
        return;
      }
      auto recorded = records.record_end(end_of_rank_exit(node, 5, 77, exited(1)));
      ASSERT_TRUE(recorded.won);
      decided[node] = records.decide_after_failure(recorded.end, false, kMaxRestarts);
    });
    ASSERT_TRUE(decided[1]);
    EXPECT_EQ(decided[1]->verdict, attempt == 0 ? Verdict::kRestart : Verdict::kExhausted);
    EXPECT_EQ(decided[1]->restarts, attempt + 1);
    // The other nodes read the same end and the same decision; one they would record is too late.
    auto other = node_client();
    AttemptRecords records(*other, attempt);
    auto end = records.record_end(EndRecord{EndKind::kPreempted, 0, -1, "late", 10, false});
    EXPECT_FALSE(end.won);
    EXPECT_EQ(end.end.kind, EndKind::kFailure);
    EXPECT_EQ(end.end.reason, "rank 5 on node 1 (pid 77) exited with code 1");
    Decision late = records.record_decision(Decision{Verdict::kPreempted, 0, 0, "late", {}});
    EXPECT_EQ(late.to_json(), decided[1]->to_json());
  }
  EXPECT_EQ(exit_code_of(Decision::from_json(node_client()->try_get(decision_key(1)).value_or(""))), 9);
}

TEST_F(OutcomeStore, PermanentExitCodeEndsTheJobWithoutSpendingARestart) {
  auto client = node_client();
  AttemptRecords records(*client, 0);
  auto recorded = records.record_end(end_of_rank_exit(0, 3, 50, exited(static_cast<int>(ExitCode::kPlanMismatch))));
  Decision d = records.decide_after_failure(recorded.end, false, 5);
  EXPECT_EQ(d.verdict, Verdict::kFatal);
  EXPECT_EQ(exit_code_of(d), 5);
  EXPECT_EQ(d.reason,
            "rank 3 on node 0 (pid 50) exited with code 5: not restarting, since exit code 5 means a restart cannot "
            "fix it");
  EXPECT_FALSE(client->try_get("restarts"));
}

TEST_F(OutcomeStore, AnElasticJobGoesOnWithoutANodeThatUsedUpTheRestartsWithAFreshBudget) {
  auto client = node_client();
  AttemptRecords first(*client, 0);
  auto e0 = first.record_end(end_of_rank_exit(2, 5, 77, exited(1)));
  EXPECT_EQ(first.decide_after_failure(e0.end, false, 1, std::vector<int>{0, 1, 3}).verdict, Verdict::kRestart);
  AttemptRecords second(*client, 1);
  auto e1 = second.record_end(end_of_rank_exit(2, 5, 78, exited(1)));
  Decision d = second.decide_after_failure(e1.end, false, 1, std::vector<int>{0, 1, 3});
  EXPECT_EQ(d.verdict, Verdict::kShrink);
  EXPECT_EQ(d.nodes, (std::vector<int>{0, 1, 3}));
  EXPECT_THAT(d.reason, HasSubstr("node 2 used up the job's 1 restarts: the job goes on without it"));
  EXPECT_EQ(Decision::from_json(d.to_json()).nodes, d.nodes);
  EXPECT_EQ(client->add("restarts", 0), 0);  // the smaller job starts with the whole budget
  // Without a node to drop (not elastic, or too few nodes left), the restarts are exhausted as before.
  AttemptRecords third(*client, 2);
  auto e2 = third.record_end(end_of_rank_exit(1, 3, 79, exited(1)));
  EXPECT_EQ(third.decide_after_failure(e2.end, false, 0).verdict, Verdict::kExhausted);
}

TEST_F(OutcomeStore, SignalDuringAFailureMakesItAPreemption) {
  auto client = node_client();
  AttemptRecords records(*client, 0);
  auto recorded = records.record_end(end_of_rank_exit(0, 3, 50, exited(1)));
  Decision d = records.decide_after_failure(recorded.end, true, 5);
  EXPECT_EQ(d.verdict, Verdict::kPreempted);
  EXPECT_EQ(exit_code_of(d), 10);
}

TEST_F(OutcomeStore, UnknownRecordInTheStoreIsRejected) {
  auto client = node_client();
  client->set(end_key(0), R"({"kind":"exploded","node":2,"rank":-1,"reason":"x","exit_code":0,"permanent":false})");
  AttemptRecords records(*client, 0);
  auto recorded = records.record_end(EndRecord{EndKind::kSuccess, 0, -1, "every rank exited 0", 0, false});
  EXPECT_FALSE(recorded.won);
  EXPECT_EQ(recorded.end.kind, EndKind::kFatal);
  EXPECT_EQ(recorded.end.exit_code, 1);
  EXPECT_THAT(recorded.end.reason, HasSubstr("unknown end kind 'exploded'"));
}

}  // namespace
}  // namespace dtrain::launch
