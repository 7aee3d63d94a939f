// The verifier against the mutations that cause hangs in practice, each expecting its own specific error.
#include "dtrain/ir/verify.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtrain/ir/text.h"
#include "ir_fixtures.h"

namespace dtrain::ir {
namespace {

using namespace ir::testing;
using plan::Schedule;
using ::testing::HasSubstr;

std::vector<Program> programs_for(int tp, int pp, int dp, int microbatches, bool sp = false) {
  plan::ParallelConfig c = layout(tp, pp, dp, 1, Schedule::k1F1B);
  c.sequence_parallel = sp;
  return lower_all(make(small_gpt(8), c, microbatches));
}

std::size_t find(const Program& p, Opcode op, What what, int mb) {
  for (std::size_t pc = 0; pc < p.schedule.size(); ++pc) {
    const Instr& in = p.schedule[pc];
    if (in.op == op && in.what == what && in.mb == mb) return pc;
  }
  ADD_FAILURE() << "instruction not found";
  return 0;
}

TEST(Verifier, DroppedRecvIsUnmatched) {
  auto programs = programs_for(1, 2, 1, 4);
  Program& last = programs[1];
  std::size_t pc = find(last, Opcode::kRecv, What::kActivation, 3);
  last.schedule.erase(last.schedule.begin() + static_cast<long>(pc));
  VerifyReport r = verify(programs);
  ASSERT_FALSE(r.ok);
  // Static check: the forward of micro-batch 3 would consume an activation never received.
  EXPECT_EQ(r.problems.front().kind, ProblemKind::kStatic);
  EXPECT_THAT(r.problems.front().message, HasSubstr("runs before the activation it consumes was received"));
}

TEST(Verifier, DroppedRecvOfAGroupedPairIsReportedByTheRun) {
  // Remove a RECV and the forward that needs it from the last stage: statically legal for that rank alone, but the
  // first stage's SEND is never received.
  auto programs = programs_for(1, 2, 1, 2);
  Program& last = programs[1];
  std::size_t recv = find(last, Opcode::kRecv, What::kActivation, 1);
  last.schedule.erase(last.schedule.begin() + static_cast<long>(recv));
  for (auto& in : last.schedule) {
    if (in.group >= 0) in.group = -1;
  }
  // Keep the program statically consistent: micro-batch 1 is then never run on this stage.
  last.num_microbatches = 1;
  std::vector<Instr> kept;
  for (const auto& in : last.schedule) {
    if (in.mb == 1 && (in.is_compute_pass() || in.op == Opcode::kLoad || in.is_p2p())) continue;
    kept.push_back(in);
  }
  last.schedule = kept;
  VerifyReport r = verify(programs);
  ASSERT_FALSE(r.ok);
  const Problem* run_problem = nullptr;
  for (const auto& p : r.problems) {
    if (p.kind == ProblemKind::kUnmatched || p.kind == ProblemKind::kDeadlock) run_problem = &p;
  }
  ASSERT_NE(run_problem, nullptr) << report_text(r);
  EXPECT_THAT(run_problem->message, HasSubstr("rank 0 pc"));
  EXPECT_THAT(run_problem->message, HasSubstr("SEND what=act chunk=0 mb=1"));
}

TEST(Verifier, SwappedSendsDeadlock) {
  // GPipe on 2 stages: stage 0 sends activations of micro-batches 0 and 1 in order; swapping them makes stage 0
  // wait in SEND mb=1 while stage 1 waits in RECV mb=0.
  plan::ParallelConfig c = layout(1, 2, 1, 1, Schedule::kGpipe);
  auto programs = lower_all(make(small_gpt(8), c, 2));
  Program& first = programs[0];
  std::size_t a = find(first, Opcode::kSend, What::kActivation, 0);
  std::size_t b = find(first, Opcode::kSend, What::kActivation, 1);
  std::swap(first.schedule[a].mb, first.schedule[b].mb);
  std::swap(first.schedule[a].group, first.schedule[b].group);
  VerifyReport r = verify(programs);
  ASSERT_FALSE(r.ok);
  // A statically visible problem (sending micro-batch 1's activation before its forward) or the run's deadlock.
  bool found = false;
  for (const auto& p : r.problems) {
    if (p.kind == ProblemKind::kStatic) {
      EXPECT_THAT(p.message, HasSubstr("sends an activation before its forward ran"));
      found = true;
    }
  }
  EXPECT_TRUE(found) << report_text(r);
}

TEST(Verifier, SwappedSendsAfterTheirForwardsDeadlock) {
  // Two forwards, then both sends in the wrong order: statically legal, a wait-for cycle at run time.
  plan::ParallelConfig c = layout(1, 2, 1, 1, Schedule::kGpipe);
  auto programs = lower_all(make(small_gpt(8), c, 2));
  Program& first = programs[0];
  std::vector<Instr> rebuilt;
  Instr send0, send1;
  for (const auto& in : first.schedule) {
    if (in.op == Opcode::kSend && in.mb == 0) {
      send0 = in;
      send0.group = -1;
      continue;
    }
    if (in.op == Opcode::kSend && in.mb == 1) {
      send1 = in;
      send1.group = -1;
      rebuilt.push_back(send1);  // mb 1 first ...
      rebuilt.push_back(send0);  // ... then mb 0
      continue;
    }
    rebuilt.push_back(in);
  }
  first.schedule = rebuilt;
  VerifyReport r = verify(programs);
  ASSERT_FALSE(r.ok);
  ASSERT_EQ(r.problems.size(), 1u) << report_text(r);
  EXPECT_EQ(r.problems[0].kind, ProblemKind::kDeadlock);
  EXPECT_THAT(r.problems[0].message, HasSubstr("deadlock: a wait-for cycle of 2 rank(s)"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("rank 0 pc"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("SEND what=act chunk=0 mb=1"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("rank 1 pc"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("RECV what=act chunk=0 mb=0"));
}

TEST(Verifier, ReorderedTensorParallelCollectivesMismatch) {
  auto programs = programs_for(2, 1, 1, 2);
  Program& peer = programs[1];
  // Give rank 1 its own copy of the forward body with two all-reduces swapped.
  for (auto& b : peer.bodies) {
    if (b->kind != BodyKind::kForward) continue;
    auto copy = std::make_shared<Body>(*b);
    std::vector<std::size_t> collectives;
    for (std::size_t i = 0; i < copy->instrs.size(); ++i) {
      if (copy->instrs[i].is_collective()) collectives.push_back(i);
    }
    ASSERT_GE(collectives.size(), 2u);
    std::swap(copy->instrs[collectives[0]], copy->instrs[collectives[1]]);
    b = copy;
  }
  VerifyReport r = verify(programs);
  ASSERT_FALSE(r.ok);
  ASSERT_EQ(r.problems.size(), 1u) << report_text(r);
  EXPECT_EQ(r.problems[0].kind, ProblemKind::kMismatch);
  EXPECT_THAT(r.problems[0].message, HasSubstr("collective #0 on the tp group {0,1} differs between members"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("rank 0 pc"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("rank 1 pc"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("body pc"));
  EXPECT_FALSE(r.representative);
}

TEST(Verifier, SplitGroupDeadlocks) {
  // 1F1B steady state on 2 stages: "send activation + receive gradient" is one group on stage 0 and "send gradient +
  // receive activation" one on stage 1. Splitting a group into single instructions leaves both sides sending first.
  auto programs = programs_for(1, 2, 1, 4);
  bool split = false;
  for (auto& p : programs) {
    for (std::size_t pc = 0; pc + 1 < p.schedule.size() && !split; ++pc) {
      Instr& a = p.schedule[pc];
      Instr& b = p.schedule[pc + 1];
      if (a.group >= 0 && a.group == b.group && a.op == Opcode::kSend && b.op == Opcode::kRecv) {
        a.group = -1;
        b.group = -1;
        split = true;
      }
    }
  }
  ASSERT_TRUE(split);
  // The other side's matching group still pairs SEND+RECV; split it too so both sides send first.
  for (auto& p : programs) {
    for (std::size_t pc = 0; pc + 1 < p.schedule.size(); ++pc) {
      Instr& a = p.schedule[pc];
      Instr& b = p.schedule[pc + 1];
      if (a.group >= 0 && a.group == b.group && a.op == Opcode::kSend && b.op == Opcode::kRecv) {
        a.group = -1;
        b.group = -1;
        break;
      }
    }
  }
  VerifyReport r = verify(programs);
  ASSERT_FALSE(r.ok);
  ASSERT_EQ(r.problems.size(), 1u) << report_text(r);
  EXPECT_EQ(r.problems[0].kind, ProblemKind::kDeadlock);
  EXPECT_THAT(r.problems[0].message, HasSubstr("wait-for cycle"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("SEND what="));
}

TEST(Verifier, ChangedMessageSizeMismatches) {
  auto programs = programs_for(1, 2, 1, 4);
  Program& first = programs[0];
  std::size_t pc = find(first, Opcode::kSend, What::kActivation, 2);
  first.schedule[pc].count += 1;
  VerifyReport r = verify(programs);
  ASSERT_FALSE(r.ok);
  ASSERT_EQ(r.problems.size(), 1u) << report_text(r);
  EXPECT_EQ(r.problems[0].kind, ProblemKind::kMismatch);
  EXPECT_THAT(r.problems[0].message, HasSubstr("a send and its receive disagree on the element count"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("SEND what=act chunk=0 mb=2"));
  EXPECT_THAT(r.problems[0].message, HasSubstr("RECV what=act chunk=0 mb=2"));
}

TEST(Verifier, RepresentativeAndFullRunsAgreeOnValidPrograms) {
  auto programs = programs_for(2, 2, 2, 4, true);
  VerifyReport fast = verify(programs);
  EXPECT_TRUE(fast.ok);
  EXPECT_TRUE(fast.representative);
  EXPECT_EQ(fast.simulated_ranks, 2);
  // Make rank 7 a distinct (but still correct) copy: identical content, different body objects and an equivalent
  // schedule; the verifier then runs everything.
  Program& r7 = programs[7];
  r7.schedule.back() = r7.schedule.back();  // same
  r7.plan_digest = r7.plan_digest;          // same
  std::swap(r7.schedule[r7.schedule.size() - 1], r7.schedule[r7.schedule.size() - 1]);
  VerifyReport full = verify(programs);
  EXPECT_TRUE(full.ok);
}

TEST(Verifier, MissingRankAndForeignPlan) {
  auto programs = programs_for(1, 2, 1, 2);
  auto missing = programs;
  missing.pop_back();
  VerifyReport r = verify(missing);
  ASSERT_FALSE(r.ok);
  EXPECT_THAT(r.problems[0].message, HasSubstr("no program for rank 1 of 2"));
  programs[1].plan_digest = "other";
  VerifyReport f = verify(programs);
  ASSERT_FALSE(f.ok);
  EXPECT_THAT(f.problems[0].message, HasSubstr("was lowered from plan other"));
}

}  // namespace
}  // namespace dtrain::ir
