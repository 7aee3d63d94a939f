#include "dtrain/calibrate/fit.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace dtrain::calibrate::detail {

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

std::vector<double> bounded_fit(const std::vector<std::vector<double>>& slopes, const std::vector<double>& gap,
                                const std::vector<double>& current, const std::vector<double>& lowest) {
  // Each figure free, held at its current value, or held at its bound: 3^n cases, the feasible one of least residual
  // (the first of equals: every figure free comes first, a figure held where it was before one held at its bound).
  const std::size_t n = current.size();
  std::vector<double> best(n, 0.0);
  double best_residual = std::numeric_limits<double>::infinity();
  double scale = 0;
  for (double g : gap) scale += g * g;
  std::size_t cases = 1;
  for (std::size_t j = 0; j < n; ++j) cases *= 3;
  for (std::size_t code = 0; code < cases; ++code) {
    std::vector<double> change(n, 0.0);
    std::vector<std::size_t> free;
    std::size_t rest_code = code;
    for (std::size_t j = 0; j < n; ++j, rest_code /= 3) {
      const std::size_t state = rest_code % 3;  // 0 free, 1 held, 2 at the bound
      if (state == 0) free.push_back(j);
      if (state == 2) change[j] = lowest[j] - current[j];
    }
    // Normal equations over the free figures, on what the held ones leave of the gap: k rows of k + 1.
    const std::size_t k = free.size();
    std::vector<std::vector<double>> a(k, std::vector<double>(k + 1, 0.0));
    for (std::size_t i = 0; i < gap.size(); ++i) {
      double rest = gap[i];
      for (std::size_t j = 0; j < n; ++j) rest -= slopes[i][j] * change[j];
      for (std::size_t p = 0; p < k; ++p) {
        for (std::size_t q = 0; q < k; ++q) a[p][q] += slopes[i][free[p]] * slopes[i][free[q]];
        a[p][k] += slopes[i][free[p]] * rest;
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
      if (a[p][p] == 0 || std::abs(a[p][p]) <= 1e-12 * diag_scale) solved = false;
      for (std::size_t q = 0; q < k && solved; ++q) {
        if (q == p) continue;
        const double factor = a[q][p] / a[p][p];
        for (std::size_t c = 0; c <= k; ++c) a[q][c] -= factor * a[p][c];
      }
    }
    if (!solved) continue;
    for (std::size_t p = 0; p < k; ++p) change[free[p]] = a[p][k] / a[p][p];
    bool feasible = true;
    for (std::size_t j = 0; j < n; ++j) {
      feasible = feasible && std::isfinite(change[j]) && current[j] + change[j] >= lowest[j] - 1e-9;
    }
    if (!feasible) continue;
    double residual = 0;
    for (std::size_t i = 0; i < gap.size(); ++i) {
      double r = gap[i];
      for (std::size_t j = 0; j < n; ++j) r -= slopes[i][j] * change[j];
      residual += r * r;
    }
    if (residual < best_residual - 1e-9 * scale) {
      best_residual = residual;
      best = change;
    }
  }
  return best;
}

}  // namespace dtrain::calibrate::detail
