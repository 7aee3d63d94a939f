// The wait-for analysis of a hung job (dtrain/ir/waits.h): for positions that hang cases leave, the right root and
// chains.
#include "dtrain/ir/waits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir_fixtures.h"

namespace dtrain::ir {
namespace {

using namespace ir::testing;
using plan::Schedule;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// tp2 pp2 (ranks 0,1 stage 0; 2,3 stage 1), two micro-batches, 1F1B.
// With sequence parallelism: the replicated norm weights' gradients are reduced over tp in the schedule.
std::vector<Program> tp2pp2() {
  plan::ParallelConfig c = layout(2, 2, 1, 1, Schedule::k1F1B);
  c.sequence_parallel = true;
  return lower_all(make(small_gpt(8), c, 2));
}

std::size_t find(const Program& p, Opcode op, What what, CommGroup on = CommGroup::kNone) {
  for (std::size_t pc = 0; pc < p.schedule.size(); ++pc) {
    const Instr& in = p.schedule[pc];
    if (in.op == op && in.what == what && (on == CommGroup::kNone || in.on == on)) return pc;
  }
  ADD_FAILURE() << "instruction not found";
  return 0;
}

// The body pc of the first collective in the pass at schedule pc `pc`, -1 when none.
std::int32_t first_collective(const Program& p, std::size_t pc) {
  const Instr& pass = p.schedule[pc];
  const Body* b = p.body(pass.chunk, BodyKind::kForward);
  for (std::size_t i = 0; b != nullptr && i < b->instrs.size(); ++i) {
    if (b->instrs[i].is_collective()) return static_cast<std::int32_t>(i);
  }
  return -1;
}

ReportedPosition at(const Program& p, std::int64_t step, std::size_t pc, Activity activity, double seconds = 5) {
  ReportedPosition r;
  r.rank = p.rank;
  r.known = true;
  r.step = step;
  r.pc = static_cast<std::int32_t>(pc);
  r.activity = activity;
  r.seconds = seconds;
  r.instruction = pc < p.schedule.size() ? to_text(p.schedule[pc]) : "end of step";
  return r;
}

TEST(Waits, EveryoneInTheGradNormAllReduceWaitsForTheRankStillComputing) {
  auto programs = tp2pp2();
  const std::size_t norm = find(programs[0], Opcode::kAllReduce, What::kGradNorm);
  std::vector<ReportedPosition> pos;
  for (int r = 0; r < 4; ++r) pos.push_back(at(programs[r], 3, norm, Activity::kComm));
  // Rank 3 is still in its last backward pass (the instruction before its tp and world reductions).
  const std::size_t last_bwd = [&] {
    std::size_t pc = 0;
    for (std::size_t i = 0; i < programs[3].schedule.size(); ++i)
      if (programs[3].schedule[i].is_compute_pass()) pc = i;
    return pc;
  }();
  pos[3] = at(programs[3], 3, last_bwd, Activity::kCompute, 30);
  WaitAnalysis a = analyze_waits(programs, pos);
  EXPECT_EQ(a.step, 3);
  EXPECT_FALSE(a.cycle);
  ASSERT_THAT(a.roots, ElementsAre(3));
  EXPECT_THAT(a.ranks[3].doing, HasSubstr("in compute at `BWD"));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(a.ranks[r].chain.back(), 3) << "rank " << r;
    EXPECT_FALSE(a.ranks[r].waits_for.empty());
  }
  // Rank 2 (rank 3's tensor-parallel peer) is in the world all-reduce: it waits for rank 3 directly.
  EXPECT_THAT(a.ranks[2].waits_for, ElementsAre(3));
  std::string text = wait_report_text(a);
  EXPECT_THAT(text, HasSubstr("the root at step 3: rank 3"));
  EXPECT_THAT(text, HasSubstr("rank 1 waits for rank 3: in communication at `ALLREDUCE on=world what=grad_norm"));
}

// dp4 (the elastic tests' layout): a node lost while its rank was in the gradient-norm all-reduce, another rank
// reported still in its backward pass (a heartbeat-old position). The lost rank is the root, not the one that is
// behind: seen in the elastic test on a loaded machine.
TEST(Waits, ARankLostInsideACollectiveIsTheRootNotTheOneStillComputing) {
  const auto programs = lower_all(make(small_gpt(8), layout(1, 1, 4, 1, Schedule::k1F1B), 2));
  const std::size_t norm = find(programs[0], Opcode::kAllReduce, What::kGradNorm);
  std::vector<ReportedPosition> pos;
  for (int r = 0; r < 4; ++r) pos.push_back(at(programs[r], 6, norm, Activity::kComm));
  std::size_t last_bwd = 0;
  for (std::size_t i = 0; i < programs[1].schedule.size(); ++i)
    if (programs[1].schedule[i].is_compute_pass()) last_bwd = i;
  pos[1] = at(programs[1], 6, last_bwd, Activity::kCompute, 0.2);
  pos[3].process = "lost with node 3";
  WaitAnalysis a = analyze_waits(programs, pos);
  ASSERT_THAT(a.roots, ElementsAre(3)) << wait_report_text(a);
  EXPECT_THAT(a.ranks[3].doing, HasSubstr("lost with node 3"));
  EXPECT_THAT(wait_report_text(a),
              HasSubstr("the waits end at rank 1, still running; rank 3 no longer runs: the root"));
  // The same positions with rank 3 alive: the rank still computing is the root, as before.
  pos[3].process.clear();
  ASSERT_THAT(analyze_waits(programs, pos).roots, ElementsAre(1));
}

TEST(Waits, AStoppedRankIsTheRootWhateverItLastReported) {
  auto programs = tp2pp2();
  // Rank 1 was stopped inside its first forward; its tensor-parallel peer waits in that forward's first collective,
  // stage 1 waits for the activation.
  const std::size_t fwd = find(programs[1], Opcode::kForward, What::kNone);
  std::vector<ReportedPosition> pos;
  pos.push_back(at(programs[0], 5, fwd, Activity::kComm));
  pos[0].body_pc = first_collective(programs[0], fwd);
  ASSERT_GE(pos[0].body_pc, 0);
  pos[0].instruction =
      to_text(programs[0].body(0, BodyKind::kForward)->instrs[static_cast<std::size_t>(pos[0].body_pc)]);
  pos.push_back(at(programs[1], 5, fwd, Activity::kCompute, 12));
  pos[1].process = "stopped (SIGSTOP)";
  const std::size_t recv2 = find(programs[2], Opcode::kRecv, What::kActivation);
  pos.push_back(at(programs[2], 5, recv2, Activity::kComm));
  pos.push_back(at(programs[3], 5, recv2, Activity::kComm));
  WaitAnalysis a = analyze_waits(programs, pos);
  ASSERT_THAT(a.roots, ElementsAre(1));
  EXPECT_THAT(a.ranks[1].doing, HasSubstr("stopped (SIGSTOP); its last report (0.0 s before): in compute"));
  EXPECT_THAT(a.ranks[0].waits_for, ElementsAre(1));
  EXPECT_EQ(a.ranks[2].chain.back(), 1);
  EXPECT_EQ(a.ranks[3].chain.back(), 1);
}

TEST(Waits, ARankRunningAnotherProgramIsNamedWithBothInstructions) {
  auto programs = tp2pp2();
  // Rank 1's program has its tp reduction of replicated gradients and the world's gradient-norm all-reduce swapped:
  // it waits in the world all-reduce where its peers wait in the tp one.
  const std::size_t tp_red = find(programs[1], Opcode::kAllReduce, What::kReplicatedGrads, CommGroup::kTp);
  const std::size_t norm = find(programs[1], Opcode::kAllReduce, What::kGradNorm);
  ASSERT_LT(tp_red, norm);
  std::vector<ReportedPosition> pos;
  pos.push_back(at(programs[0], 2, tp_red, Activity::kComm));
  pos.push_back(at(programs[1], 2, tp_red, Activity::kComm));
  pos[1].instruction = to_text(programs[1].schedule[norm]);
  pos.push_back(at(programs[2], 2, find(programs[2], Opcode::kAllReduce, What::kGradNorm), Activity::kComm));
  pos.push_back(at(programs[3], 2, find(programs[3], Opcode::kAllReduce, What::kGradNorm), Activity::kComm));
  WaitAnalysis a = analyze_waits(programs, pos);
  ASSERT_THAT(a.roots, ElementsAre(1));
  EXPECT_TRUE(a.ranks[1].other_program);
  EXPECT_THAT(a.ranks[1].doing, HasSubstr("runs another program than the plan's"));
  EXPECT_THAT(a.ranks[1].doing, HasSubstr("what=grad_norm"));
  EXPECT_THAT(a.ranks[1].doing, HasSubstr("where the plan has `ALLREDUCE on=tp what=replicated_grads"));
  EXPECT_THAT(a.ranks[0].waits_for, ElementsAre(1));
  for (int r : {2, 3}) EXPECT_EQ(a.ranks[r].chain.back(), 1) << "rank " << r;
}

TEST(Waits, ARankStillInAnEarlierStepIsTheRoot) {
  auto programs = tp2pp2();
  const std::size_t norm = find(programs[0], Opcode::kAllReduce, What::kGradNorm);
  std::vector<ReportedPosition> pos;
  for (int r = 0; r < 4; ++r) pos.push_back(at(programs[r], 8, norm, Activity::kComm));
  pos[2] = at(programs[2], 7, 3, Activity::kCompute);
  WaitAnalysis a = analyze_waits(programs, pos);
  EXPECT_EQ(a.step, 8);
  ASSERT_THAT(a.roots, ElementsAre(2));
  EXPECT_THAT(a.ranks[2].doing, HasSubstr("step 7 pc 3"));
}

TEST(Waits, RanksPastTheProgramWaitForTheOnesStillInIt) {
  auto programs = tp2pp2();
  std::vector<ReportedPosition> pos;
  for (int r = 0; r < 4; ++r) pos.push_back(at(programs[r], 4, 0, Activity::kStepEnd));
  pos[0] = at(programs[0], 4, 2, Activity::kCompute, 40);  // rank 0 never finished its step
  WaitAnalysis a = analyze_waits(programs, pos);
  ASSERT_THAT(a.roots, ElementsAre(0));
  for (int r = 1; r < 4; ++r) EXPECT_THAT(a.ranks[r].waits_for, ElementsAre(0)) << "rank " << r;
}

TEST(Waits, ACycleOfWaitingRanksIsADeadlock) {
  // The programs themselves deadlock (rank 1's swapped, as its report says): every rank waits for another.
  auto programs = tp2pp2();
  const std::size_t tp_red = find(programs[1], Opcode::kAllReduce, What::kReplicatedGrads, CommGroup::kTp);
  const std::size_t norm = find(programs[1], Opcode::kAllReduce, What::kGradNorm);
  std::swap(programs[1].schedule[tp_red], programs[1].schedule[norm]);
  std::vector<ReportedPosition> pos;
  pos.push_back(at(programs[0], 2, tp_red, Activity::kComm));
  pos.push_back(at(programs[1], 2, tp_red, Activity::kComm));
  pos.push_back(at(programs[2], 2, find(programs[2], Opcode::kAllReduce, What::kGradNorm), Activity::kComm));
  pos.push_back(at(programs[3], 2, find(programs[3], Opcode::kAllReduce, What::kGradNorm), Activity::kComm));
  WaitAnalysis a = analyze_waits(programs, pos);
  EXPECT_TRUE(a.cycle);
  EXPECT_THAT(a.roots, ::testing::UnorderedElementsAre(0, 1));
  EXPECT_THAT(wait_report_text(a), HasSubstr("a deadlock at step 2: ranks"));
}

TEST(Waits, WithoutProgramsTheRanksNotCommunicatingAreTheRoots) {
  auto programs = tp2pp2();
  std::vector<ReportedPosition> pos;
  for (int r = 0; r < 4; ++r) pos.push_back(at(programs[r], 1, 5, Activity::kComm));
  pos[3].activity = Activity::kCompute;
  WaitAnalysis a = analyze_waits({}, pos);
  ASSERT_THAT(a.roots, ElementsAre(3));
  ASSERT_FALSE(a.notes.empty());
  EXPECT_THAT(a.notes[0], HasSubstr("programs are not known"));
  nlohmann::json j = wait_report_json(a);
  EXPECT_EQ(j["roots"], nlohmann::json::array({3}));
  EXPECT_EQ(j["ranks"].size(), 4u);
}

}  // namespace
}  // namespace dtrain::ir
