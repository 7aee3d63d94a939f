// FP8 GEMMs emulated on the CPU ([training] fp8; executor/runtime/src/layer_gemms.h): the tiny models train with
// them, close to fp32 and yet measurably not bf16, under each recipe and format, in tensor-parallel and expert-
// parallel layouts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "exec_test_support.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;

TrainOptions options(const std::string& model, int steps, const std::string& fix) {
  TrainOptions o;
  o.model_path = model;
  o.steps = steps;
  o.seed = 7;
  o.fixed = {fix};
  o.activations = DType::kBf16;
  return o;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]) / b[i]);
  return d;
}

constexpr const char* kOneRank = "dp=1,tp=1,pp=1";

// 30 steps: the loss ends within a few percent of fp32's; and FP8 is really applied: its curve leaves bf16's by far
// more than bf16's leaves fp32's.
TEST(Fp8Training, HybridFollowsFp32WithinAFewPercentAndIsNotBf16) {
  const int steps = curve_steps(30);
  const auto fp32 = losses(train_threads(1, tiny_options(steps, kOneRank, DType::kFp32)));
  const auto bf16 = losses(train_threads(1, tiny_options(steps, kOneRank, DType::kBf16)));
  const auto fp8 =
      losses(train_threads(1, options(with_fp8("examples/models/tiny.toml", "hybrid", "delayed"), steps, kOneRank)));
  ASSERT_EQ(fp8.size(), fp32.size());
  EXPECT_NEAR(fp8.back(), fp32.back(), 0.03 * fp32.back());
  const double bf16_off = max_relative_difference(bf16, fp32), fp8_off = max_relative_difference(fp8, bf16);
  EXPECT_GT(fp8_off, 3 * bf16_off) << "fp8 " << fp8_off << ", bf16 " << bf16_off;
  if (steps == 30) {
    EXPECT_LT(fp8.back(), fp8.front() - 1.0);  // and it learns
  }
}

// Delayed and tensorwise scaling, hybrid and e4m3 gradients: four different curves, each close to the others.
TEST(Fp8Training, EachRecipeAndFormatChangesTheNumerics) {
  const int steps = curve_steps(8);
  std::vector<std::vector<double>> curves;
  for (const auto& [format, recipe] : std::vector<std::pair<std::string, std::string>>{
           {"hybrid", "delayed"}, {"hybrid", "tensorwise"}, {"e4m3", "delayed"}, {"e4m3", "tensorwise"}}) {
    curves.push_back(
        losses(train_threads(1, options(with_fp8("examples/models/tiny.toml", format, recipe), steps, kOneRank))));
  }
  for (std::size_t i = 0; i < curves.size(); ++i) {
    for (std::size_t j = i + 1; j < curves.size(); ++j) {
      EXPECT_NE(curves[i], curves[j]) << i << " " << j;
      EXPECT_LT(max_relative_difference(curves[i], curves[j]), 0.01) << i << " " << j;
    }
  }
}

// Each tensor-parallel shard is scaled by its own amax, so the layout is close to one rank, not equal.
TEST(Fp8Training, TensorParallelWithSequenceParallelismFollowsOneRank) {
  const int steps = curve_steps(10);
  const std::string model = with_fp8("examples/models/tiny.toml", "hybrid", "delayed");
  const auto one = losses(train_threads(1, options(model, steps, kOneRank)));
  const auto tp2 = losses(train_threads(2, options(model, steps, "dp=1,tp=2,pp=1,sequence_parallel=true")));
  EXPECT_LT(max_relative_difference(tp2, one), 0.01);
}

// The experts' grouped GEMMs and the shared experts run in FP8 (each expert its own scales), the router does not.
TEST(Fp8Training, ExpertParallelMoeTrainsCloseToOneRank) {
  const int steps = curve_steps(10);
  const std::string model = with_fp8("tests/data/models/tiny-moe-shared.toml", "hybrid", "tensorwise");
  const auto one = losses(train_threads(1, options(model, steps, "ep=1,dp=1,tp=1,pp=1,micro_batch=4")));
  const auto ep2 = losses(train_threads(2, options(model, steps, "ep=2,dp=2,tp=1,pp=1")));
  EXPECT_LT(max_relative_difference(ep2, one), 0.01);
  if (steps == 10) {
    EXPECT_LT(one.back(), one.front() - 0.3);
  }
}

}  // namespace
}  // namespace dtrain::exec
