#include "dtrain/ir/lower.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "dtrain/common/error.h"
#include "dtrain/ir/text.h"
#include "dtrain/ir/verify.h"
#include "ir_fixtures.h"

namespace dtrain::ir {
namespace {

using namespace ir::testing;
using plan::Schedule;

struct Counts {
  std::map<std::tuple<int, int, int>, int> passes;                  // (opcode, chunk, mb) -> count (pieces merged)
  std::map<std::tuple<int, int, int, int, int>, int> sends, recvs;  // (src, dst, what, chunk, mb)
};

// Every forward and backward once per (chunk, micro-batch); sends and receives pair one to one.
void check_structure(const std::vector<Program>& programs, const plan::ParallelConfig& c) {
  Counts k;
  for (const auto& p : programs) {
    for (const auto& in : p.schedule) {
      if (in.is_compute_pass()) {
        if (in.layer_end < 0) {
          k.passes[{static_cast<int>(in.op), in.chunk, in.mb}]++;
        } else {
          k.passes[{static_cast<int>(in.op) + 100, in.chunk, in.mb}]++;  // pieces counted separately
        }
      }
      if (in.op == Opcode::kSend) k.sends[{p.rank, in.peer, static_cast<int>(in.what), in.chunk, in.mb}]++;
      if (in.op == Opcode::kRecv) k.recvs[{in.peer, p.rank, static_cast<int>(in.what), in.chunk, in.mb}]++;
    }
  }
  const int chunks = c.pp * c.vpp;
  bool split = c.schedule == Schedule::kZbH1;
  for (int ch = 0; ch < chunks; ++ch) {
    for (int j = 0; j < c.num_microbatches; ++j) {
      // tp * dp ranks run each (chunk, micro-batch)
      EXPECT_EQ((k.passes[{static_cast<int>(Opcode::kForward), ch, j}]), c.tp * c.dp) << "F c" << ch << " mb" << j;
      if (split) {
        EXPECT_EQ((k.passes[{static_cast<int>(Opcode::kBackwardInput), ch, j}]), c.tp * c.dp);
      } else {
        int whole = k.passes[{static_cast<int>(Opcode::kBackward), ch, j}];
        int pieces = k.passes[{static_cast<int>(Opcode::kBackward) + 100, ch, j}];
        EXPECT_TRUE(whole == c.tp * c.dp || (whole == 0 && pieces >= c.tp * c.dp)) << "B c" << ch << " mb" << j;
      }
    }
  }
  EXPECT_EQ(k.sends.size(), k.recvs.size());
  for (const auto& [key, n] : k.sends) {
    EXPECT_EQ(n, 1);
    EXPECT_EQ(k.recvs[key], 1);
  }
}

struct MatrixCase {
  int pp, vpp, tp, dp;
  Schedule schedule;
  int microbatches;
};

TEST(Lowering, EveryLayoutOfTheMatrixVerifies) {
  model::ModelDescription m = small_gpt(16);
  int cases = 0;
  for (int pp : {1, 2, 4, 8}) {
    for (int vpp : {1, 2}) {
      for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1}) {
        bool interleaved = schedule == Schedule::kInterleaved;
        if (interleaved != (vpp > 1)) continue;
        if (interleaved && pp < 2) continue;
        if (pp == 1 && schedule != Schedule::k1F1B) continue;
        for (int mb : {pp, 2 * pp, 4 * pp + 1}) {
          if (interleaved && mb % pp != 0) continue;
          for (int tp : {1, 2, 4}) {
            for (int dp : {1, 2}) {
              plan::ParallelConfig c = layout(tp, pp, dp, vpp, schedule);
              c.sequence_parallel = tp > 1 && (pp + mb) % 2 == 0;
              c.distributed_optimizer = dp > 1 && mb % 2 == 1;
              c.recompute = static_cast<plan::Recompute>((tp + pp + vpp) % 3);
              SCOPED_TRACE(c.summary() + " m=" + std::to_string(mb));
              plan::Plan p = make(m, c, mb);
              auto programs = lower_all(p);
              ASSERT_EQ(static_cast<int>(programs.size()), tp * pp * dp);
              VerifyReport r = verify(programs);
              EXPECT_TRUE(r.ok) << report_text(r);
              check_structure(programs, p.config);
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_GE(cases, 150);
}

TEST(Lowering, TextRoundTrips) {
  model::ModelDescription m = small_gpt(8);
  for (Schedule s : {Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1, Schedule::kGpipe}) {
    plan::ParallelConfig c = layout(2, 2, 2, s == Schedule::kInterleaved ? 2 : 1, s);
    c.sequence_parallel = true;
    c.distributed_optimizer = true;
    plan::Plan p = make(m, c, 4);
    for (const auto& prog : lower_all(p)) {
      std::string text = print_program(prog);
      Program back = parse_program(text, "rank.ir");
      EXPECT_TRUE(back == prog) << "rank " << prog.rank;
      EXPECT_EQ(print_program(back), text);
    }
  }
}

TEST(Lowering, MalformedProgramTextNamesTheLine) {
  try {
    parse_program("program format=1 rank=0 world=1\nschedule\n  0: FWD chunk=zero mb=0\nend\n", "bad.ir");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "bad.ir:3: chunk=zero: expected an integer");
  }
  EXPECT_THROW(parse_program("program format=1 rank=0 world=1\nschedule\n  1: OPTIM\nend\n", "x"), Error);
  EXPECT_THROW(parse_program("program format=1 rank=0 world=1\nschedule\n  0: JUMP\nend\n", "x"), Error);
  EXPECT_THROW(parse_program("program format=2 rank=0 world=1\n", "x"), Error);
}

TEST(Lowering, UnknownBodyOpIsAnInputErrorNamingTheLineAndTheOp) {
  const std::string text =
      "program format=1 rank=0 world=1\nbody chunk=0 kind=fwd\n  0: COMPUTE op=attn.norm pass=fwd layer=0\n"
      "  1: COMPUTE op=attn.flash pass=fwd layer=0\nend\n";
  try {
    parse_program(text, "bad.ir");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInput);
    EXPECT_THAT(std::string(e.what()), ::testing::StartsWith("bad.ir:4: op=attn.flash: unknown stage-body op ("));
  }
}

TEST(Lowering, EveryComputeCarriesItsBodyOpAndItsName) {
  for (int i = static_cast<int>(BodyOp::kNone) + 1; i <= static_cast<int>(BodyOp::kHeadCrossEntropy); ++i) {
    auto op = static_cast<BodyOp>(i);
    EXPECT_EQ(parse_body_op(to_string(op)), op) << to_string(op);
  }
  EXPECT_EQ(parse_body_op("none"), std::nullopt);
  model::ModelDescription m = small_gpt(4);
  plan::Plan p = make(m, layout(2, 2, 1, 1, Schedule::k1F1B), 4);
  int computes = 0;
  for (const auto& prog : lower_all(p)) {
    for (const auto& body : prog.bodies) {
      for (const Instr& in : body->instrs) {
        if (in.op != Opcode::kCompute) continue;
        ++computes;
        EXPECT_NE(in.body_op, BodyOp::kNone) << to_text(in);
        EXPECT_THAT(to_text(in), ::testing::HasSubstr(fmt::format("op={} ", to_string(in.body_op))));
      }
    }
  }
  EXPECT_GT(computes, 0);
}

TEST(Lowering, OneFOneBWarmupAndBucketOverlap) {
  model::ModelDescription m = small_gpt(8);
  m.model.hidden = 1024;  // layers of 12.6M parameters: one 40 MB gradient bucket each
  m.model.ffn_hidden = 4096;
  m.training.overlap_grad_reduce = true;
  plan::ParallelConfig c = layout(1, 4, 2, 1, Schedule::k1F1B);
  plan::Plan p = make(m, c, 8);
  Program stage0 = lower(p, plan::rank_of(p.config, 0, 0, 0));
  // Stage 0 of 4 runs p - 1 = 3 warm-up forwards before its first backward.
  std::vector<std::string> passes;
  for (const auto& in : stage0.schedule) {
    std::string name;
    if (in.op == Opcode::kForward) name = "F" + std::to_string(in.mb);
    if (in.op == Opcode::kBackward) name = "B" + std::to_string(in.mb);
    if (!name.empty() && (passes.empty() || passes.back() != name)) passes.push_back(name);
  }
  std::vector<std::string> expected = {"F0", "F1", "F2", "F3", "B0", "F4", "B1", "F5",
                                       "B2", "F6", "B3", "F7", "B4", "B5", "B6", "B7"};
  EXPECT_EQ(passes, expected);
  // The last micro-batch's backward is cut at bucket boundaries, each bucket reduced right after its piece.
  int pieces_followed_by_bucket = 0;
  for (std::size_t i = 0; i + 1 < stage0.schedule.size(); ++i) {
    if (stage0.schedule[i].op == Opcode::kBackward && stage0.schedule[i].layer_end >= 0 &&
        stage0.schedule[i + 1].what == What::kGradBucket) {
      ++pieces_followed_by_bucket;
    }
  }
  EXPECT_GE(pieces_followed_by_bucket, 2);
  EXPECT_TRUE(verify(lower_all(p)).ok);
}

}  // namespace
}  // namespace dtrain::ir
