#include "planner/cost_model/nnls.h"

#include <cmath>
#include <limits>

namespace dynapipe::planner {
namespace {

// Solves the k x k system a z = b in place (Gaussian elimination, partial
// pivoting); false when singular.
bool Solve(std::vector<double>& a, std::vector<double>& b, int k) {
  for (int c = 0; c < k; ++c) {
    int pivot = c;
    for (int r = c + 1; r < k; ++r) {
      if (std::abs(a[r * k + c]) > std::abs(a[pivot * k + c])) pivot = r;
    }
    if (std::abs(a[pivot * k + c]) < 1e-12) return false;
    if (pivot != c) {
      for (int j = 0; j < k; ++j) std::swap(a[c * k + j], a[pivot * k + j]);
      std::swap(b[c], b[pivot]);
    }
    for (int r = c + 1; r < k; ++r) {
      const double f = a[r * k + c] / a[c * k + c];
      for (int j = c; j < k; ++j) a[r * k + j] -= f * a[c * k + j];
      b[r] -= f * b[c];
    }
  }
  for (int c = k - 1; c >= 0; --c) {
    double s = b[c];
    for (int j = c + 1; j < k; ++j) s -= a[c * k + j] * b[j];
    b[c] = s / a[c * k + c];
  }
  return true;
}

}  // namespace

std::vector<double> SolveNnls(const NnlsProblem& p, std::span<const double> prior, double ridge) {
  const int n = p.num_features, m = p.rows();
  std::vector<double> w0(n, 0.0);
  for (int j = 0; j < n && j < static_cast<int>(prior.size()); ++j) w0[j] = std::max(0.0, prior[j]);
  if (n == 0 || m == 0) return w0;
  // Column scales: z_j = w_j * scale_j, so every column has unit norm.
  std::vector<double> scale(n, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) scale[j] += p.x[i * n + j] * p.x[i * n + j];
  }
  for (double& s : scale) s = s > 0 ? std::sqrt(s) : 1.0;
  // Normal equations of the scaled problem with the ridge toward the prior.
  std::vector<double> ata(n * n, 0.0), aty(n, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      const double xj = p.x[i * n + j] / scale[j];
      aty[j] += xj * p.y[i];
      for (int k = 0; k < n; ++k) ata[j * n + k] += xj * p.x[i * n + k] / scale[k];
    }
  }
  const double lambda = std::max(0.0, ridge);
  for (int j = 0; j < n; ++j) {
    ata[j * n + j] += lambda;
    aty[j] += lambda * w0[j] * scale[j];
  }
  auto objective = [&](const std::vector<double>& z) {
    // z' A z - 2 b' z (the constant dropped).
    double v = 0;
    for (int j = 0; j < n; ++j) {
      double az = 0;
      for (int k = 0; k < n; ++k) az += ata[j * n + k] * z[k];
      v += z[j] * az - 2 * aty[j] * z[j];
    }
    return v;
  };
  std::vector<double> best(n, 0.0);
  double best_obj = objective(best);
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    std::vector<int> free;
    for (int j = 0; j < n; ++j) {
      if (mask & (1u << j)) free.push_back(j);
    }
    const int k = static_cast<int>(free.size());
    std::vector<double> a(k * k), b(k);
    for (int r = 0; r < k; ++r) {
      b[r] = aty[free[r]];
      for (int c = 0; c < k; ++c) a[r * k + c] = ata[free[r] * n + free[c]];
    }
    if (!Solve(a, b, k)) continue;
    std::vector<double> z(n, 0.0);
    bool feasible = true;
    for (int r = 0; r < k; ++r) {
      if (b[r] < 0) feasible = false;
      z[free[r]] = b[r];
    }
    if (!feasible) continue;
    const double obj = objective(z);
    if (obj < best_obj) {
      best_obj = obj;
      best = std::move(z);
    }
  }
  for (int j = 0; j < n; ++j) best[j] /= scale[j];
  return best;
}

}  // namespace dynapipe::planner
