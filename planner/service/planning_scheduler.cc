#include "planner/service/planning_scheduler.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/service/metric_buckets.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {

void PlanningScheduler::Run() {
  while (!stopping_) {
    uint64_t epoch;
    {
      MutexLock lock(&mu_);
      epoch = epoch_;
    }
    std::string job;
    int64_t iteration;
    std::shared_ptr<const JobRuntime> rt;
    if (ClaimWork(&job, &iteration, &rt)) {
      PlanOne(job, iteration, *rt);
      continue;
    }
    MutexLock lock(&mu_);
    options_.clock->AwaitWithDeadline(
        &mu_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return epoch_ != epoch || stopping_.load(); },
        options_.clock->Now() + options_.recheck);
  }
}

void PlanningScheduler::Wake() {
  MutexLock lock(&mu_);
  ++epoch_;
}

void PlanningScheduler::Stop() {
  stopping_ = true;
  Wake();
}

bool PlanningScheduler::ClaimWork(std::string* job, int64_t* iteration, std::shared_ptr<const JobRuntime>* rt) {
  auto ids = store_->ListJobs();
  if (!ids.ok()) return false;
  for (const std::string& id : *ids) {
    auto status = store_->GetJob(id);
    if (!status.ok() || store::IsTerminal(status->state())) continue;
    const int lookahead = status->spec().planner_lookahead();
    const int64_t lo = status->iterations_done();
    const int64_t hi = std::min<int64_t>(status->spec().iterations(), lo + lookahead);
    for (int64_t i = lo; i < hi && !stopping_; ++i) {
      auto planned = store_->IsPlanned(id, i);
      if (!planned.ok() || *planned) continue;
      auto leased = store_->TryLease(id, i, options_.owner, options_.lease_ttl);
      if (!leased.ok() || !*leased) continue;
      // Committed by another process between the two checks?
      if (auto again = store_->IsPlanned(id, i); !again.ok() || *again) {
        (void)store_->ReleaseLease(id, i, options_.owner);
        continue;
      }
      auto runtime = runtimes_->Get(id);
      if (!runtime.ok()) {
        (void)store_->ReleaseLease(id, i, options_.owner);
        const auto code = runtime.status().code();
        if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) continue;
        // Ended since its state was read above (cancelled, say): nothing to plan.
        if (auto now = store_->GetJob(id); now.ok() && store::IsTerminal(now->state())) break;
        spdlog::error("job {}: {}", id, runtime.status().message());
        (void)store_->SetJobState(id, proto::JobState::failed, std::string(runtime.status().message()), NowMs());
        continue;
      }
      *job = id;
      *iteration = i;
      *rt = *runtime;
      return true;
    }
  }
  return false;
}

void PlanningScheduler::PlanOne(const std::string& job, int64_t iteration, const JobRuntime& rt) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanRequest request;
  request.record = false;
  auto plan = rt.PlannerFor(iteration)->Plan(rt.batch(iteration), iteration, request);
  if (!plan.ok()) {
    spdlog::error("job {} iteration {}: planning failed: {}", job, iteration, plan.status().message());
    (void)store_->SetJobState(job, proto::JobState::failed,
                              absl::StrCat("planning iteration ", iteration, ": ", plan.status().message()), NowMs());
    (void)store_->ReleaseLease(job, iteration, options_.owner);
    return;
  }
  auto committed = store_->CommitPlans(job, iteration, options_.owner, plan->plans, options_.plan_ttl);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  (void)store_->ReleaseLease(job, iteration, options_.owner);
  if (!committed.ok()) {
    spdlog::warn("job {} iteration {}: storing plans failed: {}", job, iteration, committed.status().message());
    return;
  }
  if (*committed) {
    if (rt.refit) rt.refit->Remember(iteration, std::move(plan->plans));
    metrics_->Observe("dynapipe_plan_latency_seconds", ms / 1e3, kLatencyBuckets, "Time to plan and store one iteration");
    metrics_->Add("dynapipe_plans_total", 1, "Iterations planned and stored by this process");
    spdlog::debug("job {} iteration {}: planned in {:.2f} ms ({} micro-batches, predicted {:.1f} ms)", job, iteration,
                  ms, plan->groups.empty() ? 0 : plan->groups[0].size(), plan->predicted_ms);
  }
}

void PlanningScheduler::Refit(const proto::IterationReport& report, int world) {
  const std::shared_ptr<const JobRuntime> rt = runtimes_->Loaded(report.job_id());
  // The refit lives with the job's planner: a process that has not loaded
  // the job (does not plan it) skips the report.
  if (!rt || !rt->refit) return;
  const std::string& job = report.job_id();
  auto stored_plans = [&](int64_t iteration) -> absl::StatusOr<std::vector<proto::ExecutionPlan>> {
    std::vector<proto::ExecutionPlan> plans;
    for (int r = 0; r < world; ++r) {
      ASSIGN_OR_RETURN(proto::ExecutionPlan p, store_->GetPlan(job, iteration, r));
      plans.push_back(std::move(p));
    }
    return plans;
  };
  const absl::Status s = rt->refit->Report(report, stored_plans);
  if (!s.ok()) {
    spdlog::debug("job {} iteration {}: cost refit skipped it: {}", job, report.iteration(), s.message());
    return;
  }
  const RefitStatus st = rt->refit->Status();
  metrics_->SetTotal("dynapipe_refit_refits_total", st.refits, "Cost refits of a job so far", {{"job", job}});
  constexpr char kErrorHelp[] =
      "Mean |predicted - measured| / measured iteration time over a job's last 20 iterations, by the cost model "
      "their plans were made with";
  if (st.base_error >= 0) {
    metrics_->Set("dynapipe_refit_prediction_error", st.base_error, kErrorHelp, {{"job", job}, {"plans", "base"}});
  }
  if (st.refit_error >= 0) {
    metrics_->Set("dynapipe_refit_prediction_error", st.refit_error, kErrorHelp, {{"job", job}, {"plans", "refit"}});
  }
}

}  // namespace dynapipe::planner::service
