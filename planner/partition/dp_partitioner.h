#pragma once

// DynaPipe's dynamic program: split an ordered list of samples into
// contiguous micro-batches minimising the predicted pipeline time
//   (S - 1) * T / C + sum(t) / D
// where t is each micro-batch's time (padded to its own longest sample), T the
// slowest micro-batch, S stages, C chunks per device, D data-parallel groups.
// For each candidate cap T: f(0) = 0, f(j) = min_{k: t(j-k, j) <= T} f(j-k) + t(j-k, j).

#include <vector>

#include "absl/status/statusor.h"

namespace dynapipe::planner {

// t(j - k, j) for every end j in 1..n and size k in 1..kmax(j); sizes beyond
// kmax(j) are infeasible (memory, profile range or a size cap).
class CostTable {
 public:
  explicit CostTable(int n);
  int n() const { return n_; }
  int kmax(int j) const { return kmax_[j]; }
  double at(int j, int k) const { return t_[offset_[j] + k - 1]; }
  // Appends t(j - k, j) for k = kmax(j) + 1; rows must be filled for j = 1, 2, ... in order.
  void Push(int j, double t);
  void FinishRow(int j);
  // True when t(j - k, j) never decreases as k grows (lets the DP stop early).
  bool monotone() const { return monotone_; }

 private:
  int n_;
  std::vector<int> kmax_;
  std::vector<size_t> offset_;
  std::vector<double> t_;
  bool monotone_ = true;
};

struct DpOptions {
  int stages = 1;             // S
  int chunks_per_device = 1;  // C
  int data_parallel = 1;      // D
  // Candidate caps closer than this relative gap to the previous kept one are
  // skipped (0 = try every distinct t: exact).
  double tolerance = 0.0;
  // How many of the best splits (each the optimum for its cap) to return; the
  // schedule search simulates each, since the objective only estimates the
  // simulated iteration time.
  int keep = 1;
};

struct DpResult {
  std::vector<int> ends;  // exclusive end index of each micro-batch, ascending
  double objective_ms = 0;
  double max_ms = 0;
  double sum_ms = 0;
  int caps_tried = 0;
  // The `keep` best distinct splits, best first (alternatives[0].ends == ends).
  struct Split {
    std::vector<int> ends;
    double objective_ms = 0;
  };
  std::vector<Split> alternatives;
};

// FAILED_PRECONDITION if some sample cannot form a micro-batch on its own.
absl::StatusOr<DpResult> SolveDp(const CostTable& table, const DpOptions& options);

// The objective of a given split (shared by the DP, baselines and tests).
double PipelineObjective(double max_ms, double sum_ms, const DpOptions& options);

}  // namespace dynapipe::planner
