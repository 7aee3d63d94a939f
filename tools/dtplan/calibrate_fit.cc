#include "calibrate_fit.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace dtrain::dtplan::calibrate_detail {

Line fit_line(const std::vector<std::pair<double, double>>& xy) {
  double sw = 0, sx = 0, sxx = 0, sy = 0, sxy = 0;
  for (const auto& [x, y] : xy) {
    const double w = 1.0 / (y * y);
    sw += w;
    sx += w * x;
    sxx += w * x * x;
    sy += w * y;
    sxy += w * x * y;
  }
  Line l;
  l.slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
  l.intercept = (sy - l.slope * sx) / sw;
  if (l.intercept < 0 || l.slope <= 0 || !std::isfinite(l.slope)) {
    l.intercept = 0;
    l.slope = sxy / sxx;
  }
  return l;
}

std::array<double, 3> bounded_fit(const std::vector<std::array<double, 3>>& slopes, const std::vector<double>& gap,
                                  const std::array<double, 3>& current, const std::array<double, 3>& lowest) {
  // Each figure free, held at its current value, or held at its bound: 27 cases, the feasible one of least residual
  // (the first of equals: every figure free comes first, a figure held where it was before one held at its bound).
  std::array<double, 3> best{};
  double best_residual = std::numeric_limits<double>::infinity();
  double scale = 0;
  for (double g : gap) scale += g * g;
  for (int code = 0; code < 27; ++code) {
    std::array<int, 3> state{code % 3, code / 3 % 3, code / 9};  // 0 free, 1 held, 2 at the bound
    std::array<double, 3> change{};
    std::vector<int> free;
    for (int j = 0; j < 3; ++j) {
      if (state[j] == 0) free.push_back(j);
      if (state[j] == 2) change[j] = lowest[j] - current[j];
    }
    // Normal equations over the free figures, on what the held ones leave of the gap.
    const std::size_t k = free.size();
    std::array<std::array<double, 4>, 3> a{};
    for (std::size_t i = 0; i < gap.size(); ++i) {
      double rest = gap[i];
      for (int j = 0; j < 3; ++j) rest -= slopes[i][j] * change[j];
      for (std::size_t p = 0; p < k; ++p) {
        for (std::size_t q = 0; q < k; ++q) a[p][q] += slopes[i][free[p]] * slopes[i][free[q]];
        a[p][3] += slopes[i][free[p]] * rest;
      }
    }
    bool solved = true;
    for (std::size_t p = 0; p < k && solved; ++p) {  // Gauss-Jordan with partial pivoting
      std::size_t pivot = p;
      for (std::size_t q = p + 1; q < k; ++q) {
        if (std::abs(a[q][p]) > std::abs(a[pivot][p])) pivot = q;
      }
      std::swap(a[p], a[pivot]);
      double diag_scale = 0;
      for (std::size_t q = 0; q < k; ++q) diag_scale = std::max(diag_scale, std::abs(a[q][q]));
      if (std::abs(a[p][p]) <= 1e-12 * diag_scale || a[p][p] == 0) solved = false;
      for (std::size_t q = 0; q < k && solved; ++q) {
        if (q == p) continue;
        const double factor = a[q][p] / a[p][p];
        for (std::size_t c = 0; c < 4; ++c) a[q][c] -= factor * a[p][c];
      }
    }
    if (!solved) continue;
    for (std::size_t p = 0; p < k; ++p) change[free[p]] = a[p][3] / a[p][p];
    bool feasible = true;
    for (int j = 0; j < 3; ++j)
      feasible = feasible && std::isfinite(change[j]) && current[j] + change[j] >= lowest[j] - 1e-9;
    if (!feasible) continue;
    double residual = 0;
    for (std::size_t i = 0; i < gap.size(); ++i) {
      double r = gap[i];
      for (int j = 0; j < 3; ++j) r -= slopes[i][j] * change[j];
      residual += r * r;
    }
    if (residual < best_residual - 1e-9 * scale) {
      best_residual = residual;
      best = change;
    }
  }
  return best;
}

}  // namespace dtrain::dtplan::calibrate_detail
