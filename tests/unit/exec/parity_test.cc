// Layout parity: every parallel layout reproduces the single-rank loss curve of the tiny Llama model (the same
// global batch, the same initial weights), through the in-process backend.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

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
  static std::vector<double> curve = [] {
    TrainOptions o;
    o.model_path = kTiny;
    o.steps = curve_steps(20);
    o.seed = 7;
    o.fixed = {"dp=1,tp=1,pp=1,vpp=1,micro_batch=4"};
    return losses(train_threads(1, o));
  }();
  return curve;
}

TEST_P(Parity, LossCurveEqualsSingleRank) {
  const Layout& l = GetParam();
  TrainOptions o;
  o.model_path = kTiny;
  o.steps = curve_steps(20);
  o.seed = 7;
  o.fixed = {fix_of(l)};
  std::vector<double> curve = losses(train_threads(l.dp * l.tp * l.pp, o));
  std::vector<double> ref = reference_curve();
  ASSERT_EQ(curve.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(curve[i], ref[i], 1e-5 * std::fabs(ref[i])) << "step " << i + 1;
  }
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

}  // namespace
}  // namespace dtrain::exec
