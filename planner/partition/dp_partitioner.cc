#include "planner/partition/dp_partitioner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dynapipe::planner {

CostTable::CostTable(int n) : n_(n), kmax_(n + 1, 0), offset_(n + 2, 0) { t_.reserve(static_cast<size_t>(n) * 16); }

void CostTable::Push(int j, double t) {
  const int k = ++kmax_[j];
  if (k > 1 && t < t_.back()) monotone_ = false;
  t_.push_back(t);
}

void CostTable::FinishRow(int j) { offset_[j + 1] = t_.size(); }

double PipelineObjective(double max_ms, double sum_ms, const DpOptions& o) {
  return (o.stages - 1) * max_ms / o.chunks_per_device + sum_ms / o.data_parallel;
}

absl::StatusOr<DpResult> SolveDp(const CostTable& table, const DpOptions& options) {
  const int n = table.n();
  if (n == 0) return DpResult{};
  // No cap below `floor` can succeed: every sample must sit in some
  // micro-batch, and the cheapest micro-batch covering sample i costs
  // cover[i] = min over ends j > i of min_{k >= j - i} t(j, k).
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> cover(n, kInf), suffix;
  for (int j = 1; j <= n; ++j) {
    const int kmax = table.kmax(j);
    suffix.assign(kmax + 2, kInf);
    for (int k = kmax; k >= 1; --k) suffix[k] = std::min(suffix[k + 1], table.at(j, k));
    for (int k = 1; k <= std::min(kmax, j); ++k) cover[j - k] = std::min(cover[j - k], suffix[k]);
  }
  double floor = 0;
  for (int i = 0; i < n; ++i) {
    if (cover[i] == kInf) {
      return absl::FailedPreconditionError(absl::StrCat("sample at position ", i, " fits in no micro-batch"));
    }
    floor = std::max(floor, cover[i]);
  }
  // Candidate caps. Exact mode: every distinct t at or above the floor.
  // With a tolerance: a geometric ladder from the floor with ratio
  // (1 + tolerance), which admits the same splits as thinning the sorted t
  // values and needs no sort.
  double top = floor;
  for (int j = 1; j <= n; ++j) top = std::max(top, table.at(j, table.kmax(j)));
  std::vector<double> caps;
  if (options.tolerance > 0) {
    for (double c = floor; c < top; c *= 1 + options.tolerance) caps.push_back(c);
    caps.push_back(top);
  } else {
    for (int j = 1; j <= n; ++j) {
      for (int k = 1; k <= table.kmax(j); ++k) {
        if (table.at(j, k) >= floor) caps.push_back(table.at(j, k));
      }
    }
    std::sort(caps.begin(), caps.end());
    caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  }

  std::vector<double> f(n + 1);
  std::vector<int> choice(n + 1), best_choice;
  const bool monotone = table.monotone();
  // f and choice: the least total of each prefix with no micro-batch over `cap`.
  auto solve = [&](double cap) {
    f[0] = 0;
    for (int j = 1; j <= n; ++j) {
      double fj = kInf;
      int cj = 0;
      const int kmax = std::min(table.kmax(j), j);
      for (int k = 1; k <= kmax; ++k) {
        const double t = table.at(j, k);
        if (t > cap) {
          if (monotone) break;
          continue;
        }
        const double v = f[j - k] + t;
        if (v < fj) {
          fj = v;
          cj = k;
        }
      }
      f[j] = fj;
      choice[j] = cj;
    }
  };
  // The least total of any split, whatever its largest micro-batch.
  solve(kInf);
  const double least_sum = f[n];
  DpResult best;
  best.objective_ms = kInf;
  double previous_cap = -1;
  for (double cap : caps) {
    // The bubble term alone already loses to the kept splits: larger caps only grow it.
    const double bar = static_cast<int>(best.alternatives.size()) < std::max(1, options.keep)
                           ? kInf
                           : best.alternatives.back().objective_ms;
    if (PipelineObjective(cap, 0, options) >= bar) break;
    // A split this cap or a larger one admits for the first time has a
    // micro-batch over the previous cap and totals at least least_sum, so
    // once that bound loses to the kept splits, so does every later cap.
    if (previous_cap >= 0 && PipelineObjective(previous_cap, least_sum, options) >= bar) break;
    previous_cap = cap;
    ++best.caps_tried;
    solve(cap);
    if (f[n] == kInf) continue;
    // Score with the realised maximum, which is at most the cap.
    double max_t = 0;
    for (int j = n; j > 0; j -= choice[j]) max_t = std::max(max_t, table.at(j, choice[j]));
    const double obj = PipelineObjective(max_t, f[n], options);
    if (obj < bar) {
      DpResult::Split split{{}, obj};
      for (int j = n; j > 0; j -= choice[j]) split.ends.push_back(j);
      std::reverse(split.ends.begin(), split.ends.end());
      auto& alts = best.alternatives;
      bool duplicate = false;
      for (const auto& a : alts) duplicate = duplicate || a.ends == split.ends;
      if (!duplicate) {
        alts.insert(std::upper_bound(alts.begin(), alts.end(), obj,
                                     [](double v, const DpResult::Split& a) { return v < a.objective_ms; }),
                    std::move(split));
        if (static_cast<int>(alts.size()) > std::max(1, options.keep)) alts.pop_back();
      }
      if (obj < best.objective_ms) {
        best.objective_ms = obj;
        best.max_ms = max_t;
        best.sum_ms = f[n];
        best_choice = choice;
      }
    }
  }
  if (best_choice.empty()) return absl::FailedPreconditionError("no split of the batch satisfies the limits");
  for (int j = n; j > 0; j -= best_choice[j]) best.ends.push_back(j);
  std::reverse(best.ends.begin(), best.ends.end());
  return best;
}

}  // namespace dynapipe::planner
