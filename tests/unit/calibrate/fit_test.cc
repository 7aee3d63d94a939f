// The arithmetic of calibration's fits (dtrain/calibrate/fit.h): the probe's three collective figures are
// recovered from runs priced by known slopes, and a figure the runs would push past its bound is held there.
#include "dtrain/calibrate/fit.h"

#include <gtest/gtest.h>

namespace dtrain::calibrate::detail {
namespace {

// Three runs like the probe's: per collective (us), per ring step (us), the bandwidth term (a multiple of it). The
// gaps come from a known change; the fit finds it.
TEST(CalibrateFit, ThreeRunsRecoverTheThreeFigures) {
  const std::vector<std::vector<double>> slopes{{40e-6, 240e-6, 0.010}, {10e-6, 60e-6, 0.010}, {80e-6, 240e-6, 0.011}};
  const std::vector<double> truth{2500, -500, 2.0};
  std::vector<double> gap;
  for (const auto& row : slopes) gap.push_back(row[0] * truth[0] + row[1] * truth[1] + row[2] * truth[2]);
  const auto change = bounded_fit(slopes, gap, {0, 800, 1}, {0, 0, 1});
  for (std::size_t j = 0; j < 3; ++j) EXPECT_NEAR(change[j], truth[j], 1e-6 * std::abs(truth[j]) + 1e-9) << j;
}

// Runs that want a negative latency per ring step and a bandwidth above the all-reduce's: both held at their bounds,
// the cost per collective takes what is left, and stays at least 0.
TEST(CalibrateFit, FiguresPastTheirBoundsAreHeldThere) {
  const std::vector<std::vector<double>> slopes{{40e-6, 80e-6, 0.010}, {10e-6, 20e-6, 0.010}, {80e-6, 80e-6, 0.011}};
  const std::vector<double> truth{3000, -200, -0.5};  // latency 100 - 200 < 0; bandwidth term x0.5 < 1
  std::vector<double> gap;
  for (const auto& row : slopes) gap.push_back(row[0] * truth[0] + row[1] * truth[1] + row[2] * truth[2]);
  const std::vector<double> current{0, 100, 1}, lowest{0, 0, 1};
  const auto change = bounded_fit(slopes, gap, current, lowest);
  for (std::size_t j = 0; j < 3; ++j) EXPECT_GE(current[j] + change[j], lowest[j] - 1e-9) << j;
  EXPECT_GT(change[0], 1000);
  EXPECT_NEAR(change[2], 0, 1e-9);  // the bandwidth stays the all-reduce's
  // Nothing to close: nothing changes.
  const auto none = bounded_fit(slopes, {0, 0, 0}, current, lowest);
  for (double c : none) EXPECT_NEAR(c, 0, 1e-12);
}

// Two figures, as the probe fits them (per collective, per ring step), from three runs that agree: found exactly.
TEST(CalibrateFit, TwoFiguresFromThreeRuns) {
  const std::vector<std::vector<double>> slopes{{40e-6, 240e-6}, {10e-6, 60e-6}, {80e-6, 240e-6}};
  std::vector<double> gap;
  for (const auto& row : slopes) gap.push_back(row[0] * 2900 + row[1] * (-400));
  const auto change = bounded_fit(slopes, gap, {0, 800}, {0, 0});
  ASSERT_EQ(change.size(), 2U);
  EXPECT_NEAR(change[0], 2900, 1e-6);
  EXPECT_NEAR(change[1], -400, 1e-6);
}

TEST(CalibrateFit, ALineThroughTimesByFlops) {
  // 100 GFLOP/s with a half-size of 0.01 GFLOP: time = (F + 1e7) / 1e11.
  std::vector<std::pair<double, double>> points;
  for (double f : {3.3e7, 1.3e8, 2.7e8, 2.1e9}) points.emplace_back(f, (f + 1e7) / 1e11);
  const Line l = fit_line(points);
  EXPECT_NEAR(1 / l.slope, 1e11, 1e3);
  EXPECT_NEAR(l.intercept / l.slope, 1e7, 1);
}

}  // namespace
}  // namespace dtrain::calibrate::detail
