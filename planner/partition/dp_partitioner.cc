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

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// No cap below the floor can succeed: every sample must sit in some
// micro-batch, and the cheapest micro-batch covering sample i costs
// cover[i] = min over ends j > i of min_{k >= j - i} t(j, k).
absl::StatusOr<double> CapFloor(const CostTable& table) {
  const int n = table.n();
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
  return floor;
}

// Candidate caps, ascending. Exact mode: every distinct t at or above the
// floor. With a tolerance: a geometric ladder from the floor with ratio
// (1 + tolerance), which admits the same splits as thinning the sorted t
// values and needs no sort.
std::vector<double> CandidateCaps(const CostTable& table, double floor, double tolerance) {
  const int n = table.n();
  double top = floor;
  for (int j = 1; j <= n; ++j) top = std::max(top, table.at(j, table.kmax(j)));
  std::vector<double> caps;
  if (tolerance > 0) {
    for (double c = floor; c < top; c *= 1 + tolerance) caps.push_back(c);
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
  return caps;
}

// The least total of each prefix with no micro-batch over a cap, and the
// size of the last micro-batch of each prefix's best split.
class CappedPrefixDp {
 public:
  explicit CappedPrefixDp(const CostTable& table)
      : table_(table), n_(table.n()), monotone_(table.monotone()), f_(n_ + 1), choice_(n_ + 1) {}

  void Solve(double cap) {
    f_[0] = 0;
    for (int j = 1; j <= n_; ++j) {
      double fj = kInf;
      int cj = 0;
      const int kmax = std::min(table_.kmax(j), j);
      for (int k = 1; k <= kmax; ++k) {
        const double t = table_.at(j, k);
        if (t > cap) {
          if (monotone_) break;
          continue;
        }
        const double v = f_[j - k] + t;
        if (v < fj) {
          fj = v;
          cj = k;
        }
      }
      f_[j] = fj;
      choice_[j] = cj;
    }
  }
  // The whole batch's least total under the last cap solved (kInf: none).
  double total() const { return f_[n_]; }
  // The realised largest micro-batch time of the solved split.
  double MaxTime() const {
    double max_t = 0;
    for (int j = n_; j > 0; j -= choice_[j]) max_t = std::max(max_t, table_.at(j, choice_[j]));
    return max_t;
  }
  const std::vector<int>& choice() const { return choice_; }

 private:
  const CostTable& table_;
  const int n_;
  const bool monotone_;
  std::vector<double> f_;
  std::vector<int> choice_;
};

// The ascending exclusive ends of the split `choice` describes.
std::vector<int> EndsOf(const std::vector<int>& choice, int n) {
  std::vector<int> ends;
  for (int j = n; j > 0; j -= choice[j]) ends.push_back(j);
  std::reverse(ends.begin(), ends.end());
  return ends;
}

// Adds `split` to the best-first alternatives unless it is already there,
// keeping at most max(1, keep).
void KeepAlternative(DpResult::Split split, int keep, std::vector<DpResult::Split>& alts) {
  bool duplicate = false;
  for (const auto& a : alts) duplicate = duplicate || a.ends == split.ends;
  if (duplicate) return;
  const double obj = split.objective_ms;
  alts.insert(std::upper_bound(alts.begin(), alts.end(), obj,
                               [](double v, const DpResult::Split& a) { return v < a.objective_ms; }),
              std::move(split));
  if (static_cast<int>(alts.size()) > std::max(1, keep)) alts.pop_back();
}

}  // namespace

absl::StatusOr<DpResult> SolveDp(const CostTable& table, const DpOptions& options) {
  const int n = table.n();
  if (n == 0) return DpResult{};
  absl::StatusOr<double> floor = CapFloor(table);
  if (!floor.ok()) return floor.status();
  const std::vector<double> caps = CandidateCaps(table, *floor, options.tolerance);

  CappedPrefixDp dp(table);
  std::vector<int> best_choice;
  // The least total of any split, whatever its largest micro-batch.
  dp.Solve(kInf);
  const double least_sum = dp.total();
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
    dp.Solve(cap);
    if (dp.total() == kInf) continue;
    // Score with the realised maximum, which is at most the cap.
    const double max_t = dp.MaxTime();
    const double obj = PipelineObjective(max_t, dp.total(), options);
    if (obj < bar) {
      KeepAlternative(DpResult::Split{EndsOf(dp.choice(), n), obj}, options.keep, best.alternatives);
      if (obj < best.objective_ms) {
        best.objective_ms = obj;
        best.max_ms = max_t;
        best.sum_ms = dp.total();
        best_choice = dp.choice();
      }
    }
  }
  if (best_choice.empty()) return absl::FailedPreconditionError("no split of the batch satisfies the limits");
  best.ends = EndsOf(best_choice, n);
  return best;
}

}  // namespace dynapipe::planner
