// The fits of calibration (dtrain/calibrate/calibrate.h) that are arithmetic alone: a line through measured points, and
// the bounded least-squares fit of the executor probe's collective figures.
#pragma once

#include <utility>
#include <vector>

namespace dtrain::calibrate::detail {

// y = slope x + intercept by least squares on relative error (weights 1 / y^2); through the origin when that fit gives
// a negative intercept.
struct Line {
  double slope = 0, intercept = 0;
};
Line fit_line(const std::vector<std::pair<double, double>>& xy);

// The least-squares change of n figures that closes `gap` (one entry per run; slopes[i][j]: how run i's prediction
// moves per unit of figure j), each figure (current[j] + change[j]) kept at or above lowest[j]: every figure free where
// that fits within the bounds, else the best fit with some figures held at their current value or their bound.
std::vector<double> bounded_fit(const std::vector<std::vector<double>>& slopes, const std::vector<double>& gap,
                                const std::vector<double>& current, const std::vector<double>& lowest);

}  // namespace dtrain::calibrate::detail
