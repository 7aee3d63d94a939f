// Layout parity: every parallel layout reproduces the single-rank loss curve of the tiny Llama model (the same
// global batch, the same initial weights), through the in-process backend.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "exec_test_support.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;

struct Layout {
  int dp, tp, pp, vpp;
  const char* schedule;
  bool sp, dopt;
  const char* recompute;
};

std::string fix_of(const Layout& l) {
  return fmt::format("dp={},tp={},pp={},vpp={},schedule={},sequence_parallel={},distributed_optimizer={},recompute={}",
                     l.dp, l.tp, l.pp, l.vpp, l.schedule, l.sp, l.dopt, l.recompute);
}

class Parity : public ::testing::TestWithParam<Layout> {};

std::vector<double> reference_curve() {
  static std::vector<double> curve = single_rank_curve(kTiny);
  return curve;
}

TEST_P(Parity, LossCurveEqualsSingleRank) {
  const Layout& l = GetParam();
  const std::vector<double> ref = reference_curve();
  expect_same_curve(losses(train_threads(l.dp * l.tp * l.pp, tiny_options(curve_steps(20), fix_of(l), DType::kFp32))),
                    ref);
  if (ref.size() == 20) {
    EXPECT_LT(ref.back(), ref.front() - 0.5);  // the model learns (in 20 steps)
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Parity,
    ::testing::Values(
        Layout{2, 1, 1, 1, "1f1b", false, false, "none"}, Layout{2, 1, 1, 1, "1f1b", false, true, "none"},
        Layout{1, 2, 1, 1, "1f1b", false, false, "none"}, Layout{1, 2, 1, 1, "1f1b", true, false, "none"},
        Layout{1, 1, 2, 1, "1f1b", false, false, "none"}, Layout{1, 1, 2, 1, "gpipe", false, false, "none"},
        Layout{1, 1, 2, 1, "zb-h1", false, false, "none"}, Layout{1, 1, 2, 2, "interleaved", false, false, "none"},
        Layout{2, 2, 2, 1, "1f1b", false, false, "none"}, Layout{2, 2, 2, 1, "1f1b", true, true, "none"},
        Layout{2, 2, 2, 1, "zb-h1", true, true, "full"}, Layout{1, 2, 2, 2, "interleaved", true, false, "selective"}),
    [](const ::testing::TestParamInfo<Layout>& p) {
      const Layout& l = p.param;
      std::string s = fmt::format("dp{}tp{}pp{}vpp{}_{}{}{}_{}", l.dp, l.tp, l.pp, l.vpp, l.schedule, l.sp ? "_sp" : "",
                                  l.dopt ? "_dopt" : "", l.recompute);
      for (char& c : s) {
        if (c == '-') c = '_';
      }
      return s;
    });

}  // namespace
}  // namespace dtrain::exec

namespace dtrain::exec {
namespace {

using namespace exec::testing;

// The comparison above is not vacuous: another seed, or one step of another learning rate, moves the curve by far
// more than the tolerance.
TEST(ParityControl, ADifferentSeedGivesADifferentCurve) {
  TrainOptions o;
  o.model_path = kTiny;
  o.steps = 3;
  o.fixed = {"dp=1,tp=1,pp=1,vpp=1,micro_batch=4"};
  o.seed = 7;
  auto a = losses(train_threads(1, o));
  o.seed = 8;
  auto b = losses(train_threads(1, o));
  EXPECT_GT(std::fabs(a[2] - b[2]), 1e-3 * std::fabs(a[2]));
}

// GPT-2's vocabulary of 50257 entries, which no tensor-parallel degree divides: padded as Megatron pads it (50304
// rows on one rank, 50432 over tp = 2), it trains under tp = 2 (and tp = 2 with pp = 2, where the tied embeddings'
// two copies are summed over the padded shard) as on one rank; and the padded rows take no probability, so one rank
// with padding equals one rank without it (make_vocab_size_divisible_by = 1: 50257 rows exactly).
TEST(PaddedVocabulary, Gpt2VocabularyTrainsUnderTensorParallelismAsOneRank) {
  const std::string model = std::string(DTRAIN_SOURCE_DIR) + "/tests/data/models/tiny-gpt2-vocab.toml";
  auto curve = [&](const std::string& path, const std::string& fix, int world) {
    TrainOptions o;
    o.model_path = path;
    o.steps = curve_steps(10);
    o.seed = 11;
    o.fixed = {fix};
    return losses(train_threads(world, o));
  };
  const std::vector<double> ref = curve(model, "dp=1,tp=1,pp=1,micro_batch=2", 1);

  const std::string unpadded = ::testing::TempDir() + "/tiny-gpt2-unpadded.toml";
  {
    std::ifstream in(model);
    std::stringstream text;
    text << in.rdbuf();
    std::string t = text.str();
    t.replace(t.find("vocab = 50257\n"), 14, "vocab = 50257\nmake_vocab_size_divisible_by = 1\n");
    std::ofstream(unpadded) << t;
  }
  for (const auto& [path, fix, world] :
       {std::tuple{unpadded, std::string("dp=1,tp=1,pp=1,micro_batch=2"), 1},
        std::tuple{model, std::string("dp=1,tp=2,pp=1,micro_batch=2"), 2},
        std::tuple{model, std::string("dp=1,tp=2,pp=1,micro_batch=2,sequence_parallel=true"), 2},
        std::tuple{model, std::string("dp=1,tp=2,pp=2,micro_batch=2"), 4}}) {
    SCOPED_TRACE(fix + (path == unpadded ? " (unpadded)" : ""));
    expect_same_curve(curve(path, fix, world), ref);
  }
  // The steps train (the comparison is not of a constant), from about ln(50257), the near-uniform start.
  EXPECT_NEAR(ref.front(), std::log(50257.0), 0.2);
  EXPECT_GT(std::fabs(ref.back() - ref.front()), 1e-3);
}

}  // namespace
}  // namespace dtrain::exec

namespace dtrain::exec {
namespace {

using namespace exec::testing;

// A padded vocabulary's checkpoint holds the real rows only: written under dp = 2, tp = 2 with the distributed
// optimizer (the padding in the last shard), it resumes under tp = 2 and under tp = 1 to the uninterrupted curve.
TEST(PaddedVocabulary, CheckpointsUnderTensorParallelismResumeInAnyLayout) {
  const std::string model = std::string(DTRAIN_SOURCE_DIR) + "/tests/data/models/tiny-gpt2-vocab.toml";
  const std::string dir = ::testing::TempDir() + "/padded-vocab-ckpt";
  std::filesystem::remove_all(dir);
  auto options = [&](const std::string& fix, int steps) {
    TrainOptions o;
    o.model_path = model;
    o.steps = steps;
    o.seed = 11;
    o.fixed = {fix};
    o.deterministic = true;
    return o;
  };
  const std::vector<double> ref = losses(train_threads(2, options("dp=1,tp=2,pp=1,micro_batch=2", 4)));
  // Written by data-parallel tensor-parallel ranks with the distributed optimizer (each stores the moments it owns).
  TrainOptions first = options("dp=2,tp=2,pp=1,micro_batch=1,distributed_optimizer=true", 2);
  first.checkpoint_dir = dir;
  train_threads(4, first);
  for (const auto& [fix, world] : {std::pair{std::string("dp=1,tp=2,pp=1,micro_batch=2"), 2},
                                   std::pair{std::string("dp=1,tp=1,pp=1,micro_batch=2"), 1}}) {
    SCOPED_TRACE(fix);
    // A copy each: a resumed run writes its own last checkpoint, which the next would resume from.
    const std::string copy = dir + "-" + std::to_string(world);
    std::filesystem::remove_all(copy);
    std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    TrainOptions resumed = options(fix, 4);
    resumed.checkpoint_dir = copy;
    resumed.resume = true;
    const std::vector<double> c = losses(train_threads(world, resumed));
    ASSERT_EQ(c.size(), 2u);
    for (std::size_t i = 0; i < 2; ++i) EXPECT_NEAR(c[i], ref[i + 2], 1e-5 * ref[i + 2]) << "step " << i + 3;
    std::filesystem::remove_all(copy);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::exec
