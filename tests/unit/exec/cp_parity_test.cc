// Context parallelism (cp) run by the interpreter: each rank holds two of the 2 * cp chunks of every sequence, the
// attention gathers the keys and values of all of them (all_gather) or passes them around the cp ranks block by
// block (p2p, the ring); its layouts reproduce the single-rank loss curve of the tiny Llama (and of the tiny MoE with
// its experts over the dp x cp ranks and its load-balancing loss), its programs exchange keys and values around every
// attention, and a checkpoint written with cp resumes without it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/ir/lower.h"
#include "dtrain/ir/text.h"
#include "dtrain/ir/verify.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/topology/local_cpu.h"
#include "exec_test_support.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;

struct CpLayout {
  int cp, dp, tp, pp;
  const char* extra;                // further --fix keys
  const char* comm = "all_gather";  // cp_comm: the all-gather, the ring (p2p) or the heads' all-to-all (a2a)
};

std::string cp_fix(const CpLayout& l) {
  return fmt::format("cp={},cp_comm={},dp={},tp={},pp={}{}", l.cp, l.comm, l.dp, l.tp, l.pp, l.extra);
}

class CpParity : public ::testing::TestWithParam<CpLayout> {};

TEST_P(CpParity, LossCurveEqualsSingleRank) {
  static const std::vector<double> ref = single_rank_curve(kTiny);
  const CpLayout& l = GetParam();
  expect_same_curve(
      losses(train_threads(l.cp * l.dp * l.tp * l.pp, tiny_options(curve_steps(20), cp_fix(l), DType::kFp32))), ref);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpParity,
                         ::testing::Values(CpLayout{2, 1, 1, 1, ""}, CpLayout{2, 1, 2, 1, ",sequence_parallel=true"},
                                           CpLayout{2, 1, 1, 2, ",schedule=1f1b,recompute=selective"},
                                           CpLayout{2, 2, 1, 1, ",distributed_optimizer=true,recompute=full"},
                                           // The ring: with cp = 4 a block passes three ranks and its gradients
                                           // travel behind it.
                                           CpLayout{2, 1, 1, 1, "", "p2p"}, CpLayout{4, 1, 1, 1, "", "p2p"},
                                           CpLayout{2, 1, 2, 1, ",sequence_parallel=true", "p2p"},
                                           CpLayout{2, 1, 1, 2, ",schedule=1f1b,recompute=selective", "p2p"},
                                           CpLayout{4, 2, 1, 1, ",distributed_optimizer=true,recompute=full", "p2p"},
                                           // The heads' all-to-all: each of the 2 ranks one KV head's group.
                                           CpLayout{2, 1, 1, 1, "", "a2a"},
                                           CpLayout{2, 1, 1, 2, ",schedule=1f1b,recompute=selective", "a2a"},
                                           CpLayout{2, 2, 1, 1, ",distributed_optimizer=true,recompute=full", "a2a"}),
                         [](const ::testing::TestParamInfo<CpLayout>& p) {
                           const CpLayout& l = p.param;
                           const std::string_view comm = l.comm;
                           return fmt::format("cp{}dp{}tp{}pp{}{}", l.cp, l.dp, l.tp, l.pp,
                                              comm == "p2p"   ? "_ring"
                                              : comm == "a2a" ? "_a2a"
                                                              : "");
                         });

// The heads' all-to-all over 4 ranks (each one query and one key/value head of the tiny Llama with 4 KV heads), with
// tensor parallelism beside it (8 ranks: each tensor-parallel rank's 2 heads over cp = 2).
TEST(CpHeads, FourRanksEachWithOneHeadEqualTheSingleRank) {
  const std::string mha = ::testing::TempDir() + "/tiny-mha.toml";
  std::ostringstream tiny;
  tiny << std::ifstream(kTiny).rdbuf();
  std::string text = tiny.str();
  text.replace(text.find("kv_heads = 2"), 12, "kv_heads = 4");
  std::ofstream(mha) << text;
  const std::vector<double> ref = single_rank_curve(mha);
  for (const auto& [ranks, fix] : {std::pair{4, "cp=4,cp_comm=a2a,dp=1,tp=1,pp=1"},
                                   std::pair{8, "cp=2,cp_comm=a2a,dp=2,tp=2,pp=1,sequence_parallel=true"}}) {
    SCOPED_TRACE(fix);
    TrainOptions o = tiny_options(curve_steps(20), fix, DType::kFp32);
    o.model_path = mha;
    expect_same_curve(losses(train_threads(ranks, o)), ref);
  }
}

// The tiny MoE, its load-balancing loss included (per sequence: its statistics summed over the cp ranks, ALLREDUCE
// what=router_stats): the experts split over two of the dp x cp ranks, with each of the three exchanges.
TEST(CpMoe, ExpertsOverTheContextParallelRanksEqualTheSingleRank) {
  expect_layouts_follow_single_rank(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny-moe.toml", 2,
                                    {"cp=2,cp_comm=all_gather,ep=2,dp=1,tp=1,pp=1",
                                     "cp=2,cp_comm=p2p,ep=2,dp=1,tp=1,pp=1", "cp=2,cp_comm=a2a,ep=2,dp=1,tp=1,pp=1"});
}

// The tiny Llama's plan on 4 CPU ranks with context parallelism (one sequence a micro-batch).
plan::Plan tiny_cp_plan(int cp, plan::CpComm comm, int dp, plan::Recompute recompute) {
  const auto model = model::load_model(kTiny);
  plan::ParallelConfig c;
  c.cp = cp;
  c.cp_comm = comm;
  c.dp = dp;
  c.micro_batch = 1;
  c.recompute = recompute;
  return ir::plan_for_layout(model, topology::local_cpu_cluster(4), c, model.training.global_batch);
}

// The program of a cp layout: every attention's forward gathers the layer's keys and values over cp, its backward
// gathers them again and reduce-scatters their gradients; gradients are reduced over the dp x cp ranks.
TEST(CpProgram, AttentionsExchangeKeysAndValues) {
  const ir::Program p = ir::lower(tiny_cp_plan(2, plan::CpComm::kAllGather, 2, plan::Recompute::kNone), 3);
  EXPECT_EQ(p.cp, 2);
  EXPECT_EQ(p.cp_rank, 1);
  EXPECT_EQ(p.dp_rank, 1);
  EXPECT_EQ(p.cp_group, (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(p.dp_group, (std::vector<std::int32_t>{0, 1, 2, 3}));
  const std::int64_t kv = 4 * 64 * 2 * 2 * 16;  // micro-batch x seq_len x (k, v) x kv_heads x head_dim
  for (const auto& b : p.bodies) {
    int gathers = 0, scatters = 0;
    for (const auto& in : b->instrs) {
      if (in.on != ir::CommGroup::kCp) continue;
      EXPECT_EQ(in.count, kv / 4) << ir::to_text(in);
      if (in.op == ir::Opcode::kAllGather) {
        EXPECT_EQ(in.what, ir::What::kKv);
        ++gathers;
      } else {
        EXPECT_EQ(in.op, ir::Opcode::kReduceScatter);
        EXPECT_EQ(in.what, ir::What::kKvGrad);
        ++scatters;
      }
    }
    EXPECT_EQ(gathers, 4) << "one per layer";
    EXPECT_EQ(scatters, b->kind == ir::BodyKind::kForward ? 0 : 4);
  }
  const std::string text = ir::print_program(p);
  EXPECT_NE(text.find("cp=2 cp_rank=1"), std::string::npos);
  EXPECT_NE(text.find("group cp ranks=2,3"), std::string::npos);
  EXPECT_EQ(ir::parse_program(text, "cp.ir"), p);
}

// The ring (cp_comm = p2p): every attention is armed by a RING what=kv of one rank's block (forward, and again in
// the backward, which passes the blocks around with their gradients), and every attention's backward is followed by
// the gradients' last hop, RING what=kv_grad; the programs verify deadlock-free, and round-trip through the text.
TEST(CpProgram, TheRingPassesOneBlockAtATime) {
  const std::vector<ir::Program> programs =
      ir::lower_all(tiny_cp_plan(4, plan::CpComm::kP2p, 1, plan::Recompute::kSelective));
  const std::int64_t block = 64 / 4 * 2 * 2 * 16;  // seq_len / cp x (k, v) x kv_heads x head_dim
  for (const auto& b : programs[1].bodies) {
    int kv = 0, grads = 0;
    for (const auto& in : b->instrs) {
      if (in.on != ir::CommGroup::kCp) continue;
      EXPECT_EQ(in.op, ir::Opcode::kRing) << ir::to_text(in);
      EXPECT_EQ(in.count, block) << ir::to_text(in);
      (in.what == ir::What::kKv ? kv : grads)++;
    }
    EXPECT_EQ(kv, 4) << "one per layer";
    EXPECT_EQ(grads, b->kind == ir::BodyKind::kForward ? 0 : 4);
  }
  const std::string text = ir::print_program(programs[1]);
  EXPECT_NE(text.find("RING on=cp what=kv_grad"), std::string::npos);
  EXPECT_EQ(ir::parse_program(text, "ring.ir"), programs[1]);
  const ir::VerifyReport report = ir::verify(programs);
  EXPECT_TRUE(report.ok) << (report.problems.empty() ? "" : report.problems.front().message);
}

// The heads' all-to-all (cp_comm = a2a): an ALLTOALL on=cp what=heads before every attention's forward and
// backward (each member sends each its rows of one head group: seq_len/cp x (heads + 2 kv_heads)/cp x head_dim), none
// after; the programs verify deadlock-free and round-trip through the text.
TEST(CpProgram, TheHeadsAllToAllArmsEveryAttention) {
  const std::vector<ir::Program> programs =
      ir::lower_all(tiny_cp_plan(2, plan::CpComm::kA2a, 2, plan::Recompute::kNone));
  const std::int64_t part = 64 / 2 * (4 + 2 * 2) / 2 * 16;
  for (const auto& b : programs[1].bodies) {
    int heads = 0;
    for (const auto& in : b->instrs) {
      if (in.on != ir::CommGroup::kCp) continue;
      EXPECT_EQ(in.op, ir::Opcode::kAllToAll) << ir::to_text(in);
      EXPECT_EQ(in.what, ir::What::kHeads) << ir::to_text(in);
      EXPECT_EQ(in.count, part) << ir::to_text(in);
      ++heads;
    }
    EXPECT_EQ(heads, 4) << "one per layer";
  }
  const std::string text = ir::print_program(programs[1]);
  EXPECT_NE(text.find("ALLTOALL on=cp what=heads"), std::string::npos);
  EXPECT_EQ(ir::parse_program(text, "a2a.ir"), programs[1]);
  const ir::VerifyReport report = ir::verify(programs);
  EXPECT_TRUE(report.ok) << (report.problems.empty() ? "" : report.problems.front().message);
}

// A checkpoint written with cp2 resumes with cp1 (and the other way round) on the uninterrupted curve.
TEST(CpCheckpoint, ResumesWithoutContextParallelism) {
  expect_checkpoints_cross(::testing::TempDir() + "/cp-ckpt", 2,
                           "cp=2,cp_comm=all_gather,dp=1,tp=1,pp=1,micro_batch=2,distributed_optimizer=true",
                           "dp=2,tp=1,pp=1,micro_batch=2");
}

}  // namespace
}  // namespace dtrain::exec
