// A mixture of experts in the IR: expert-parallel programs carry their groups and the ALLTOALL instructions in the
// MoE layers' bodies, print and parse back, verify, and the verifier catches an all-to-all that one member skips or
// sizes differently.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "dtrain/ir/text.h"
#include "dtrain/ir/verify.h"
#include "ir_fixtures.h"

namespace dtrain::ir {
namespace {

using namespace ir::testing;
using ::testing::HasSubstr;

// Four layers, MoE at layers 1 and 3: four experts of width 64, top-2.
model::ModelDescription small_moe() {
  model::ModelDescription d = small_gpt(4);
  d.model.arch = model::Arch::kLlama;
  d.model.linear_bias = false;
  d.model.moe.experts = 4;
  d.model.moe.top_k = 2;
  d.model.moe.ffn_hidden = 64;
  d.model.moe.interval = 2;
  return d;
}

std::vector<Program> moe_programs(int tp, int pp, int dp, int ep) {
  const model::ModelDescription d = small_moe();
  plan::ParallelConfig c = layout(tp, pp, dp, 1, plan::Schedule::k1F1B);
  c.ep = ep;
  c.etp = tp;
  return lower_all(make(d, c, 2));
}

int count(const Body& b, Opcode op, What what) {
  return static_cast<int>(
      std::count_if(b.instrs.begin(), b.instrs.end(), [&](const Instr& in) { return in.op == op && in.what == what; }));
}

TEST(MoeIr, ExpertParallelProgramsCarryTheirGroupsAndAllToAlls) {
  const auto programs = moe_programs(1, 1, 4, 2);
  const Program& p = programs[3];
  EXPECT_EQ(p.ep, 2);
  EXPECT_EQ(p.ep_rank, 1);
  EXPECT_EQ(p.ep_group, (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(p.edp_group, (std::vector<std::int32_t>{1, 3}));
  const Body* fwd = p.body(0, BodyKind::kForward);
  const Body* bwd = p.body(0, BodyKind::kBackward);
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  // Two MoE layers: counts once each forward; rows there and back in each pass.
  EXPECT_EQ(count(*fwd, Opcode::kAllToAll, What::kExpertCounts), 2);
  EXPECT_EQ(count(*fwd, Opcode::kAllToAll, What::kExpertTokens), 4);
  EXPECT_EQ(count(*bwd, Opcode::kAllToAll, What::kExpertTokens), 4);
  // The experts' gradients are reduced over edp, the rest over dp.
  int edp = 0;
  for (const Instr& in : p.schedule) edp += in.on == CommGroup::kEdp && in.what == What::kExpertGradBucket ? 1 : 0;
  EXPECT_GE(edp, 1);
  EXPECT_TRUE(verify(programs).ok) << report_text(verify(programs));
  const std::string text = print_program(p);
  EXPECT_THAT(text, HasSubstr("experts ep=2 ep_rank=1\ngroup ep ranks=2,3\ngroup edp ranks=1,3\n"));
  EXPECT_THAT(text, HasSubstr("ALLTOALL on=ep what=expert_counts layer=1"));
  EXPECT_EQ(parse_program(text, "rank3.ir"), p);
}

TEST(MoeIr, TensorAndPipelineParallelExpertLayoutsVerify) {
  for (auto [tp, pp, dp, ep] : {std::tuple{2, 1, 2, 2}, std::tuple{1, 2, 2, 2}, std::tuple{2, 2, 2, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(std::tuple{tp, pp, dp, ep}));
    const auto programs = moe_programs(tp, pp, dp, ep);
    const VerifyReport r = verify(programs);
    EXPECT_TRUE(r.ok) << report_text(r);
  }
}

// With the distributed optimizer a bucket's experts are reduce-scattered and gathered over edp, the rest over dp;
// with ep = dp (an edp group of one) the experts need neither.
TEST(MoeIr, TheDistributedOptimizerShardsExpertsOverEdp) {
  for (auto [dp, ep] : {std::pair{4, 2}, std::pair{2, 2}}) {
    SCOPED_TRACE(::testing::PrintToString(std::pair{dp, ep}));
    const model::ModelDescription d = small_moe();
    plan::ParallelConfig c = layout(1, 1, dp, 1, plan::Schedule::k1F1B);
    c.ep = ep;
    c.etp = 1;
    c.distributed_optimizer = true;
    const auto programs = lower_all(make(d, c, 2));
    const Program& p = programs[1];
    std::int64_t rs_dp = 0, rs_edp = 0, ag_dp = 0, ag_edp = 0;
    for (const Instr& in : p.schedule) {
      // The world's gradient norm and loss aside, nothing is all-reduced.
      if (in.on != CommGroup::kWorld) {
        EXPECT_NE(in.op, Opcode::kAllReduce) << to_text(in);
      }
      if (in.op == Opcode::kReduceScatter) (in.on == CommGroup::kEdp ? rs_edp : rs_dp) += in.count;
      if (in.op == Opcode::kAllGather) (in.on == CommGroup::kEdp ? ag_edp : ag_dp) += in.count;
    }
    EXPECT_GT(rs_dp, 0);
    EXPECT_EQ(ag_dp, rs_dp);  // the same elements back (no tied copy to skip in a one-stage model)
    EXPECT_EQ(ag_edp, rs_edp);
    EXPECT_EQ(rs_edp > 0, dp / ep > 1);
    const VerifyReport r = verify(programs);
    EXPECT_TRUE(r.ok) << report_text(r);
    EXPECT_EQ(parse_program(print_program(p), "rank1.ir"), p);
  }
}

// etp = 1 under tp = 2 with sequence parallelism: the MoE layers' bodies have no tensor-parallel collective (each rank
// routes its own sequence shard through whole experts), the dense layers keep theirs; the experts' and shared
// experts' gradients join the replicated ones summed over tp; the program says etp=1 and parses back.
TEST(MoeIr, WholeExpertsOnEachTensorParallelRankNeedNoTensorParallelCollective) {
  const model::ModelDescription d = small_moe();
  plan::ParallelConfig c = layout(2, 1, 2, 1, plan::Schedule::k1F1B);
  c.sequence_parallel = true;
  c.ep = 2;
  c.micro_batch = 2;
  std::int64_t replicated[2] = {0, 0};
  for (int etp : {2, 1}) {
    c.etp = etp;
    const auto programs = lower_all(make(d, c, 2));
    const Program& p = programs[0];
    EXPECT_EQ(p.etp, etp == 1 ? 1 : 0);
    const Body* fwd = p.body(0, BodyKind::kForward);
    const Body* bwd = p.body(0, BodyKind::kBackward);
    ASSERT_NE(fwd, nullptr);
    ASSERT_NE(bwd, nullptr);
    for (const Body* b : {fwd, bwd}) {
      const bool forward = b == fwd;
      int moe_tp = 0, dense_tp = 0;
      for (const Instr& in : b->instrs) {
        if (in.on != CommGroup::kTp || in.layer < 0 || in.layer >= 4) continue;
        (in.layer % 2 == 1 ? moe_tp : dense_tp) += 1;
      }
      EXPECT_GT(dense_tp, 0);
      // The attention's only, in each of 2 MoE layers: forward a gather and a reduce-scatter; backward the output
      // gradient's gather, the saved input's gather, the input gradient's reduce-scatter.
      const int attention = forward ? 2 * 2 : 2 * 3;
      if (etp == 1) {
        EXPECT_EQ(moe_tp, attention);
      } else {
        EXPECT_GT(moe_tp, attention);
      }
    }
    for (const Instr& in : p.schedule) {
      if (in.what == What::kReplicatedGrads) replicated[etp == 1] += in.count;
    }
    const VerifyReport r = verify(programs);
    EXPECT_TRUE(r.ok) << report_text(r);
    const std::string text = print_program(p);
    if (etp == 1) {
      EXPECT_THAT(text, HasSubstr("experts ep=2 ep_rank=0 etp=1\n"));
    }
    EXPECT_EQ(parse_program(text, "rank0.ir"), p);
  }
  // This rank's 2 experts and no shared experts, whole: 2 x (fc1 + fc2) x hidden, in each of 2 MoE layers.
  EXPECT_EQ(replicated[1] - replicated[0], 2 * 2 * (d.model.fc1_columns(64) + 64) * d.model.hidden);
}

TEST(MoeIr, AnAllToAllOneMemberSkipsOrSizesDifferentlyIsCaught) {
  for (bool resize : {false, true}) {
    SCOPED_TRACE(resize ? "resized" : "dropped");
    auto programs = moe_programs(1, 1, 2, 2);
    Program& peer = programs[1];
    for (auto& b : peer.bodies) {
      if (b->kind != BodyKind::kForward) continue;
      auto copy = std::make_shared<Body>(*b);
      auto it = std::find_if(copy->instrs.begin(), copy->instrs.end(),
                             [](const Instr& in) { return in.what == What::kExpertTokens; });
      ASSERT_NE(it, copy->instrs.end());
      if (resize)
        it->count += 1;
      else
        copy->instrs.erase(it);
      b = copy;
    }
    const VerifyReport r = verify(programs);
    ASSERT_FALSE(r.ok);
    ASSERT_EQ(r.problems.size(), 1u) << report_text(r);
    EXPECT_EQ(r.problems[0].kind, ProblemKind::kMismatch);
    EXPECT_THAT(r.problems[0].message, HasSubstr("collective #1 on the ep group {0,1} differs between members"));
    EXPECT_THAT(r.problems[0].message, HasSubstr("ALLTOALL on=ep what=expert_tokens"));
  }
}

}  // namespace
}  // namespace dtrain::ir
