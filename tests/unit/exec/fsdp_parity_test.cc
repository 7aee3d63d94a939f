// Fully sharded data parallelism (fsdp) run by the interpreter: its layouts reproduce the single-rank loss curve of the
// tiny Llama (and the tiny MoE with its experts sharded over their own group), its programs gather parameters unit by
// unit in the bodies, and its checkpoints (each rank writing the slices it holds) resume without fsdp and the other
// way round.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "dtrain/ir/lower.h"
#include "dtrain/ir/text.h"
#include "dtrain/model/model_spec.h"
#include "dtrain/topology/local_cpu.h"
#include "exec_test_support.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;

struct FsdpLayout {
  int dp, tp, pp, vpp;
  const char* extra;  // further --fix keys
};

std::string fsdp_fix(const FsdpLayout& l) {
  return fmt::format("dp={},tp={},pp={},vpp={},distributed_optimizer=true,fsdp=true{}", l.dp, l.tp, l.pp, l.vpp,
                     l.extra);
}

class FsdpParity : public ::testing::TestWithParam<FsdpLayout> {};

TEST_P(FsdpParity, LossCurveEqualsSingleRank) {
  static const std::vector<double> ref = single_rank_curve(kTiny);
  const FsdpLayout& l = GetParam();
  expect_same_curve(losses(train_threads(l.dp * l.tp * l.pp, tiny_options(curve_steps(20), fsdp_fix(l), DType::kFp32))),
                    ref);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FsdpParity,
                         ::testing::Values(FsdpLayout{4, 1, 1, 1, ""},
                                           FsdpLayout{2, 2, 1, 1, ",sequence_parallel=true"},
                                           FsdpLayout{2, 1, 2, 1, ",schedule=1f1b"},
                                           FsdpLayout{2, 1, 2, 2, ",schedule=interleaved,recompute=full"}),
                         [](const ::testing::TestParamInfo<FsdpLayout>& p) {
                           const FsdpLayout& l = p.param;
                           return fmt::format("dp{}tp{}pp{}vpp{}", l.dp, l.tp, l.pp, l.vpp);
                         });

TEST(FsdpMoe, ExpertsShardedOverTheirGroupEqualTheSingleRank) {
  expect_layouts_follow_single_rank(std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny-moe.toml", 4,
                                    {"dp=4,tp=1,pp=1,ep=2,distributed_optimizer=true,fsdp=true",
                                     "dp=2,tp=1,pp=2,ep=2,distributed_optimizer=true,fsdp=true"});
}

// Tied word embeddings (tiny Qwen2): fsdp holds the tied matrix whole beside its shards (the head reads it after the
// embedding's unit is released), the schedule reduce-scatters its gradients and gathers its updated slices; with a
// pipeline the first and last stage keep their copies equal as without fsdp.
TEST(FsdpTied, TheTiedMatrixHeldWholeEqualsTheSingleRank) {
  const std::string tied = std::string(DTRAIN_SOURCE_DIR) + "/tests/data/models/tiny-qwen2.toml";
  expect_layouts_follow_single_rank(tied, 4,
                                    {"dp=4,tp=1,pp=1,distributed_optimizer=true,fsdp=true",
                                     "dp=2,tp=1,pp=2,distributed_optimizer=true,fsdp=true,schedule=1f1b",
                                     "dp=2,tp=2,pp=1,distributed_optimizer=true,fsdp=true,sequence_parallel=true"});
  // Its checkpoints (each rank's slices, the tied matrix's among them) resume without fsdp and the other way round.
  expect_checkpoints_cross(::testing::TempDir() + "/fsdp-tied-ckpt", 4,
                           "dp=4,tp=1,pp=1,micro_batch=1,distributed_optimizer=true,fsdp=true",
                           "dp=2,tp=1,pp=2,micro_batch=2,distributed_optimizer=false", tied);
}

// The program of a fully sharded layout: each body gathers its units' parameters over dp (one unit ahead), each
// backward reduce-scatters their gradients; the schedule has neither the bucketed reduction nor the gather after the
// optimizer step.
TEST(FsdpProgram, BodiesGatherUnitByUnitAndTheScheduleNoLongerReduces) {
  const auto model = model::load_model(kTiny);
  const auto cluster = topology::local_cpu_cluster(4);
  plan::ParallelConfig c;
  c.dp = 4;
  c.distributed_optimizer = true;
  c.fsdp = true;
  c.micro_batch = 1;
  const plan::Plan plan = ir::plan_for_layout(model, cluster, c, model.training.global_batch);
  const ir::Program p = ir::lower(plan, 1);
  EXPECT_TRUE(p.fsdp);
  for (const auto& in : p.schedule) {
    EXPECT_FALSE(in.op == ir::Opcode::kReduceScatter || in.op == ir::Opcode::kAllGather) << ir::to_text(in);
  }
  for (const auto& b : p.bodies) {
    std::vector<int> gathered, scattered;
    for (const auto& in : b->instrs) {
      if (in.op == ir::Opcode::kAllGather && in.on == ir::CommGroup::kDp) {
        EXPECT_EQ(in.what, ir::What::kLayerParams);
        gathered.push_back(in.layer);
      }
      if (in.op == ir::Opcode::kReduceScatter && in.on == ir::CommGroup::kDp) scattered.push_back(in.layer);
    }
    // The embedding, four layers, the head: forward in that order, backward the other way round.
    const std::vector<int> forward{-1, 0, 1, 2, 3, 4}, backward{4, 3, 2, 1, 0, -1};
    if (b->kind == ir::BodyKind::kForward) {
      EXPECT_EQ(gathered, forward);
      EXPECT_TRUE(scattered.empty());
    } else {
      EXPECT_EQ(gathered, backward);
      EXPECT_EQ(scattered, backward);
    }
    // One unit ahead: the second unit's gather comes before the first unit's first op.
    ASSERT_GE(b->instrs.size(), 3u);
    EXPECT_EQ(b->instrs[1].op, ir::Opcode::kAllGather);
  }
  // The text form carries it.
  const std::string text = ir::print_program(p);
  EXPECT_NE(text.find("fsdp=true"), std::string::npos);
  EXPECT_EQ(ir::parse_program(text, "fsdp.ir"), p);
  EXPECT_NE(text.find("what=layer_params"), std::string::npos);
}

// Checkpoints written under fsdp (each rank stores the slices of the parameters and moments it holds) resume without
// it, and the other way round, on the uninterrupted curve.
TEST(FsdpCheckpoint, ResumesWithoutFsdpAndTheOtherWayRound) {
  expect_checkpoints_cross(::testing::TempDir() + "/fsdp-ckpt", 4,
                           "dp=4,tp=1,pp=1,micro_batch=1,distributed_optimizer=true,fsdp=true",
                           "dp=2,tp=2,pp=1,micro_batch=2,distributed_optimizer=false");
}

}  // namespace
}  // namespace dtrain::exec
