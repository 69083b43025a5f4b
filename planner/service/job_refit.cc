#include "planner/service/job_refit.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace dynapipe::planner::service {
namespace {

RefitOptions OptionsOf(const proto::CostRefitSpec& spec) {
  RefitOptions o;
  if (spec.window() > 0) o.window = spec.window();
  if (spec.min_iterations() > 0) o.min_iterations = spec.min_iterations();
  if (spec.max_step() > 0) o.max_step = spec.max_step();
  return o;
}

template <typename Map>
void Trim(Map& m, size_t keep) {
  while (m.size() > keep) m.erase(m.begin());
}

}  // namespace

JobRefit::JobRefit(std::shared_ptr<const Planner> base, const proto::CostRefitSpec& spec)
    : base_(std::move(base)),
      world_(base_->config().pp * base_->config().dp),
      refit_(base_->model().shared_cost_model(), OptionsOf(spec)),
      current_(base_) {}

std::shared_ptr<const Planner> JobRefit::PlannerFor(int64_t iteration) {
  MutexLock lock(&mu_);
  PlanModel with = current_ == base_ ? PlanModel::kBase : PlanModel::kRefit;
  if (explore_ != nullptr && current_ != base_) {
    if (explore_until_ < 0) explore_until_ = iteration + kExploreIterations;
    if (iteration < explore_until_ && iteration % 2 == 1) with = PlanModel::kExplore;
  }
  planned_with_[iteration] = with;
  Trim(planned_with_, kKeep);
  // Exploring iterations alternate: fewer, larger micro-batches, then more,
  // smaller ones.
  if (with == PlanModel::kExplore && iteration % 4 == 3 && explore_smaller_ != nullptr) return explore_smaller_;
  return with == PlanModel::kExplore ? explore_ : current_;
}

PlanModel JobRefit::PlannedWith(int64_t iteration) const {
  MutexLock lock(&mu_);
  const auto it = planned_with_.find(iteration);
  return it == planned_with_.end() ? PlanModel::kBase : it->second;
}

void JobRefit::Remember(int64_t iteration, std::vector<proto::ExecutionPlan> plans) {
  MutexLock lock(&mu_);
  plans_[iteration] = std::move(plans);
  Trim(plans_, kKeepPlans);
}

absl::Status JobRefit::Report(const proto::IterationReport& report, const FetchPlans& fetch) {
  if (!report.error().empty()) return absl::OkStatus();
  const int64_t iteration = report.iteration();
  std::vector<proto::IterationReport> reports;
  std::vector<proto::ExecutionPlan> plans;
  {
    MutexLock lock(&mu_);
    auto& buffered = reports_[iteration];
    for (const auto& r : buffered) {
      if (r.rank() == report.rank()) return absl::OkStatus();  // a retried report
    }
    buffered.push_back(report);
    if (static_cast<int>(buffered.size()) < world_) {
      Trim(reports_, kKeep);
      return absl::OkStatus();
    }
    reports = std::move(buffered);
    reports_.erase(iteration);
    if (auto it = plans_.find(iteration); it != plans_.end()) {
      plans = std::move(it->second);
      plans_.erase(it);
    }
  }
  if (plans.empty()) {
    if (!fetch) return absl::NotFoundError(absl::StrCat("refit: no plans of iteration ", iteration));
    absl::StatusOr<std::vector<proto::ExecutionPlan>> fetched = fetch(iteration);
    if (!fetched.ok()) return fetched.status();
    plans = std::move(*fetched);
  }
  const Planner& base = *base_;
  absl::StatusOr<IterationSamples> samples = SamplesOf(base.model(), base.model().cost_model(), plans, reports);
  if (!samples.ok()) return samples.status();

  MutexLock lock(&mu_);
  RefitIteration h{iteration, samples->predicted_ms, samples->measured_ms};
  if (auto it = planned_with_.find(iteration); it != planned_with_.end()) {
    h.refit_plan = it->second != PlanModel::kBase;
    h.explore = it->second == PlanModel::kExplore;
  }
  history_.push_back(h);
  while (history_.size() > kKeep) history_.pop_front();
  ++observed_;
  const int refits = refit_.refits();
  refit_.Add(std::move(*samples));
  if (refit_.refits() == refits) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Planner>> next = Planner::Create(base.config(), refit_.model());
  if (!next.ok()) return next.status();
  current_ = std::move(*next);
  if (explore_until_ < 0 || iteration < explore_until_) {
    // Exploration plans with the DP's own splits, whose sizes change from
    // batch to batch: the whole of dynamic may settle on one packed shape,
    // and the fit needs micro-batches of many sizes to tell what a token
    // costs in a large one from what it costs in a small one.
    PlannerConfig explore_config = base.config();
    explore_config.parts.baselines = false;
    explore_config.parts.balanced = false;
    absl::StatusOr<std::unique_ptr<Planner>> explore = Planner::Create(
        explore_config, std::make_shared<RefitCostModel>(base.model().shared_cost_model(), refit_.ExplorationTerms()));
    if (!explore.ok()) return explore.status();
    explore_ = std::move(*explore);
    absl::StatusOr<std::unique_ptr<Planner>> smaller = Planner::Create(
        explore_config,
        std::make_shared<RefitCostModel>(base.model().shared_cost_model(), refit_.ExplorationTerms(/*smaller=*/true)));
    if (!smaller.ok()) return smaller.status();
    explore_smaller_ = std::move(*smaller);
  } else {
    explore_ = nullptr;
    explore_smaller_ = nullptr;
  }
  return absl::OkStatus();
}

RefitStatus JobRefit::Status() const {
  MutexLock lock(&mu_);
  RefitStatus s;
  s.observed = observed_;
  s.refits = refit_.refits();
  s.outliers = refit_.outliers();
  s.model = current_->model().cost_model().Describe();
  s.terms = refit_.terms();
  s.recent.assign(history_.begin(), history_.end());
  double sum[2] = {0, 0};
  int n[2] = {0, 0};
  constexpr size_t kErrorWindow = 20;
  for (size_t i = history_.size() > kErrorWindow ? history_.size() - kErrorWindow : 0; i < history_.size(); ++i) {
    const RefitIteration& h = history_[i];
    if (h.measured_ms <= 0 || h.explore) continue;
    sum[h.refit_plan] += std::abs(h.predicted_ms - h.measured_ms) / h.measured_ms;
    ++n[h.refit_plan];
  }
  if (n[0] > 0) s.base_error = sum[0] / n[0];
  if (n[1] > 0) s.refit_error = sum[1] / n[1];
  return s;
}

}  // namespace dynapipe::planner::service
