// Mixed precision on the CPU backend: bf16 activations and weight copies, fp32 master weights, gradients and Adam
// moments. The bf16 kernels are the reference for the CUDA backend's (compute in fp32, round each output once), so
// what holds here — the curve follows fp32 within bf16 tolerance, every layout follows the single rank — is what the
// GPU runs are checked against.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "exec_test_support.h"

namespace dtrain::exec {
namespace {

using namespace exec::testing;

const std::string kSingle = "dp=1,tp=1,pp=1,vpp=1,micro_batch=4";

std::vector<double> bf16_reference() {
  static std::vector<double> curve = losses(train_threads(1, tiny_options(curve_steps(20), kSingle, DType::kBf16)));
  return curve;
}

TEST(MixedPrecision, Bf16CurveFollowsFp32WithinBf16Tolerance) {
  const auto steps = static_cast<std::size_t>(curve_steps(20));
  std::vector<double> fp32 = losses(train_threads(1, tiny_options(curve_steps(20), kSingle, DType::kFp32)));
  std::vector<double> bf16 = bf16_reference();
  ASSERT_EQ(fp32.size(), steps);
  ASSERT_EQ(bf16.size(), steps);
  double largest = 0;
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    double rel = std::fabs(bf16[i] - fp32[i]) / fp32[i];
    largest = std::max(largest, rel);
    // bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3); the loss averages over 1024 tokens per step.
    EXPECT_LT(rel, 2e-3) << "step " << i + 1 << ": fp32 " << fp32[i] << ", bf16 " << bf16[i];
  }
  // Not the fp32 run under another name: rounding to bf16 moves the curve.
  EXPECT_GT(largest, 1e-7);
  if (steps == 20) {
    EXPECT_LT(bf16.back(), bf16.front() - 0.5);  // and it learns (in 20 steps)
  }
}

struct Bf16Layout {
  int world;
  const char* fix;
};

class Bf16Layouts : public ::testing::TestWithParam<Bf16Layout> {};

// Layouts reduce bf16 partial sums in other orders (tensor-parallel all-reduces, reduce-scatters) and round them at
// other points, so they agree with the single rank within bf16 tolerance, not bit for bit as in fp32.
TEST_P(Bf16Layouts, FollowTheSingleRankCurve) {
  const Bf16Layout& l = GetParam();
  std::vector<double> curve = losses(train_threads(l.world, tiny_options(curve_steps(20), l.fix, DType::kBf16)));
  std::vector<double> ref = bf16_reference();
  ASSERT_EQ(curve.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(curve[i], ref[i], 2e-3 * ref[i]) << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Bf16Layouts,
    ::testing::Values(Bf16Layout{2, "dp=2,tp=1,pp=1,distributed_optimizer=true"},
                      Bf16Layout{2, "dp=1,tp=2,pp=1,sequence_parallel=true"},
                      Bf16Layout{2, "dp=1,tp=1,pp=2,vpp=2,schedule=interleaved"},
                      Bf16Layout{8,
                                 "dp=2,tp=2,pp=2,schedule=zb-h1,sequence_parallel=true,distributed_optimizer=true,"
                                 "recompute=full"}),
    [](const ::testing::TestParamInfo<Bf16Layout>& p) { return fmt::format("layout{}", p.index); });

// The checkpoint holds the fp32 masters and moments; the bf16 copies are made again from them, so a resumed run is
// the uninterrupted one bit for bit.
TEST(MixedPrecision, ResumeIsBitwiseTheUninterruptedRun) {
  const std::string fix = "dp=1,tp=2,pp=2,sequence_parallel=true";
  const int total = curve_steps(10), half = total / 2;
  std::vector<double> full = losses(train_threads(4, tiny_options(total, fix, DType::kBf16)));
  std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("dtrain-mp-{}", ::getpid());
  std::filesystem::remove_all(dir);
  TrainOptions first = tiny_options(half, fix, DType::kBf16);
  first.checkpoint_dir = dir.string();
  std::vector<double> a = losses(train_threads(4, first));
  TrainOptions second = first;
  second.steps = total;
  second.resume = true;
  TrainResult resumed = train_threads(4, second);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(resumed.first_step, half);
  std::vector<double> b = losses(resumed);
  a.insert(a.end(), b.begin(), b.end());
  ASSERT_EQ(a.size(), full.size());
  for (std::size_t i = 0; i < full.size(); ++i) EXPECT_EQ(a[i], full[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace dtrain::exec
