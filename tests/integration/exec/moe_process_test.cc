// Mixture of experts in real dtexec processes over Gloo: expert-parallel layouts follow the single rank, a checkpoint
// taken under ep = 2 resumes under ep = 1 (experts are stored by global index; with the distributed optimizer their
// sharded moments too), and impossible expert layouts are refused with exit 2 before anything trains.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "job.h"

namespace dtrain::testing {
namespace {

using ::testing::HasSubstr;

const std::string kTinyMoe = std::string(DTRAIN_SOURCE_DIR) + "/examples/models/tiny-moe.toml";

std::vector<std::string> moe_args(const std::string& metrics, int steps, const std::string& fix) {
  return {"train",
          "--model",
          kTinyMoe,
          "--plan",
          "auto",
          "--data",
          "synthetic",
          "--steps",
          std::to_string(steps),
          "--seed",
          "5",
          "--metrics",
          metrics,
          "--threads",
          "1",
          "--timeout-s",
          "60",
          "--fix",
          fix};
}

TEST(MoeProcesses, ExpertParallelLayoutsOverGlooEqualTheSingleRankCurve) {
  TempDir dir;
  JobOptions single;
  single.args = moe_args(dir.path("ref.jsonl"), 20, "ep=1,dp=1,tp=1,pp=1,micro_batch=4");
  expect_ok(run_dtexec_job(single));
  const std::vector<double> ref = loss_values(dir.path("ref.jsonl"));
  ASSERT_EQ(ref.size(), 20u);
  struct MoeLayout {
    int world;
    const char* fix;
  };
  for (const MoeLayout& l :
       {MoeLayout{2, "ep=2,dp=2,tp=1,pp=1"}, MoeLayout{4, "ep=2,dp=2,tp=2,pp=1,sequence_parallel=true"},
        MoeLayout{4, "ep=2,dp=2,tp=1,pp=2"}, MoeLayout{4, "ep=2,dp=4,tp=1,pp=1"},
        MoeLayout{4, "ep=2,dp=4,tp=1,pp=1,distributed_optimizer=true"},
        MoeLayout{4, "ep=2,dp=2,tp=2,pp=1,etp=1,sequence_parallel=true"}}) {
    SCOPED_TRACE(l.fix);
    const std::string m = dir.path(fmt::format("w{}-{}.jsonl", l.world, std::hash<std::string>{}(l.fix)));
    JobOptions o;
    o.world = l.world;
    o.args = moe_args(m, 20, l.fix);
    const auto ranks = run_dtexec_job(o);
    expect_ok(ranks);
    EXPECT_THAT(ranks[0].log, HasSubstr(" ep=2 etp="));  // the plan it trained with
    const std::vector<double> curve = loss_values(m);
    ASSERT_EQ(curve.size(), ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(curve[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1;
  }
}

// 20 steps under one layout; the same run stopped at step 10 with a checkpoint and resumed under another continues
// equal to the uninterrupted run.
void expect_resumes_equal(int world, const std::string& layout, int resume_world, const std::string& resume_layout) {
  TempDir dir;
  JobOptions full;
  full.world = world;
  full.args = moe_args(dir.path("full.jsonl"), 20, layout);
  expect_ok(run_dtexec_job(full));
  const std::string ckpt = dir.path("ckpt");
  JobOptions first = full;
  first.args = moe_args(dir.path("part.jsonl"), 10, layout);
  first.args.insert(first.args.end(), {"--checkpoint-dir", ckpt});
  expect_ok(run_dtexec_job(first));
  JobOptions second;
  second.world = resume_world;
  second.args = moe_args(dir.path("part.jsonl"), 20, resume_layout);
  second.args.insert(second.args.end(), {"--checkpoint-dir", ckpt, "--resume"});
  expect_ok(run_dtexec_job(second));
  const std::vector<double> a = loss_values(dir.path("full.jsonl")), b = loss_values(dir.path("part.jsonl"));
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (std::size_t i = 10; i < 20; ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
}

// ep = 2 over dp = 2, resumed on one rank (ep = 1, every expert on it).
TEST(MoeProcesses, CheckpointAtEpTwoResumesAtEpOne) {
  expect_resumes_equal(2, "ep=2,dp=2,tp=1,pp=1", 1, "ep=1,dp=1,tp=1,pp=1");
}

// ep = 2 over dp = 4 with the distributed optimizer (the experts' Adam moments in two slices per expert, the rest in
// four), resumed under ep = 1 over dp = 2 with the distributed optimizer (every tensor in two slices).
TEST(MoeProcesses, ShardedExpertOptimizerStateResumesUnderAnotherSharding) {
  expect_resumes_equal(4, "ep=2,dp=4,tp=1,pp=1,distributed_optimizer=true", 2,
                       "ep=1,dp=2,tp=1,pp=1,distributed_optimizer=true");
}

// etp = 1 (whole experts on each tensor-parallel rank, stored once by tensor-parallel rank 0), resumed with the
// experts split over tp (etp = tp).
TEST(MoeProcesses, WholeExpertsResumeSplitOverTensorParallelism) {
  expect_resumes_equal(2, "ep=1,dp=1,tp=2,pp=1,etp=1,sequence_parallel=true", 2,
                       "ep=1,dp=1,tp=2,pp=1,sequence_parallel=true");
}

TEST(MoeProcesses, ImpossibleExpertLayoutsAreRefused) {
  TempDir dir;
  struct Case {
    int world;
    const char* fix;
    const char* says;
    int exit_code = 2;  // bad input; 3: no layout fits the pinned dimensions
  };
  for (const Case& c : {Case{1, "ep=3", "--fix ep=3 does not divide the 4 experts of model 'tiny-moe'"},
                        Case{1, "ep=2", "--fix ep=2: no layout of 1 GPUs has a data-parallel degree that ep divides"},
                        Case{1, "etp=2", "--fix etp=2: dtrain splits the experts over all of tensor parallelism"},
                        Case{2, "tp=2,etp=1,sequence_parallel=false",
                             "structure, for example: etp=1 with tp=2 needs sequence parallelism", 3}}) {
    SCOPED_TRACE(c.fix);
    JobOptions o;
    o.world = c.world;
    o.args = moe_args(dir.path("m.jsonl"), 2, c.fix);
    for (const auto& r : run_dtexec_job(o)) {
      EXPECT_EQ(r.exit_code, c.exit_code) << r.log;
      EXPECT_THAT(r.log, HasSubstr(c.says));
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path("m.jsonl")));
}

}  // namespace
}  // namespace dtrain::testing
