#pragma once

// Small non-negative least squares for the cost refit (a handful of
// unknowns): minimise |X w - y|^2 + ridge * |w - prior|^2 over w >= 0, with
// the columns of X scaled to unit norm first so that features measured in
// ms, tokens and tokens x length are conditioned alike.

#include <span>
#include <vector>

namespace dynapipe::planner {

struct NnlsProblem {
  int num_features = 0;
  std::vector<double> x;  // row-major, rows x num_features
  std::vector<double> y;  // one per row
  void AddRow(std::span<const double> features, double target) {
    x.insert(x.end(), features.begin(), features.end());
    y.push_back(target);
  }
  int rows() const { return static_cast<int>(y.size()); }
};

// The solution (num_features values, each >= 0). Exact for up to ~10
// unknowns: every subset of free variables is solved and the best feasible
// one kept. `prior` (empty: zeros) is what a feature with no data falls back
// to; `ridge` is relative to the scaled problem (1e-6 is a tie-breaker, 1 a
// strong pull).
std::vector<double> SolveNnls(const NnlsProblem& p, std::span<const double> prior, double ridge);

}  // namespace dynapipe::planner
