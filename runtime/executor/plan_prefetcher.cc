#include "runtime/executor/plan_prefetcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/status_macros.h"
#include "src/common/logging.h"

namespace dynapipe::runtime::executor {

PlanPrefetcher::PlanPrefetcher(std::string job, int rank, Fetch fetch, int64_t end, int depth,
                               std::function<bool()> stopped, absl::Duration outage_grace)
    : job_(std::move(job)),
      rank_(rank),
      fetch_(std::move(fetch)),
      end_(end),
      depth_(std::max(0, depth)),
      stopped_(std::move(stopped)),
      outage_grace_(outage_grace) {}

PlanPrefetcher::~PlanPrefetcher() {
  for (auto& [i, f] : ahead_) f.wait();
}

void PlanPrefetcher::Start(int64_t iteration) {
  if (iteration >= end_ || ahead_.contains(iteration)) return;
  ahead_[iteration] = std::async(std::launch::async, [this, iteration] { return fetch_(iteration); });
}

absl::StatusOr<proto::ExecutionPlan> PlanPrefetcher::Next(int64_t iteration) {
  for (int64_t k = iteration; k <= iteration + depth_; ++k) Start(k);
  absl::Time outage_start = absl::InfiniteFuture();  // first failure of an unbroken run of unreachable answers
  while (true) {
    auto found = ahead_.find(iteration);
    if (found == ahead_.end()) {
      return absl::OutOfRangeError(absl::StrCat("iteration ", iteration, " is past the job's ", end_, " iterations"));
    }
    std::future<absl::StatusOr<proto::ExecutionPlan>> f = std::move(found->second);
    ahead_.erase(found);
    absl::StatusOr<proto::ExecutionPlan> plan = f.get();
    if (plan.ok()) {
      if (plan->job_id() != job_ || plan->rank() != rank_ || plan->iteration() != iteration) {
        return absl::FailedPreconditionError(absl::StrCat("asked for the plan of job ", job_, " rank ", rank_,
                                                          " iteration ", iteration, ", got job ", plan->job_id(),
                                                          " rank ", plan->rank(), " iteration ", plan->iteration()));
      }
      return plan;
    }
    const absl::StatusCode code = plan.status().code();
    const bool unreachable = code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kCancelled;
    if (!unreachable) outage_start = absl::InfiniteFuture();
    if (unreachable) {
      outage_start = std::min(outage_start, absl::Now());
      if (absl::Now() - outage_start >= outage_grace_) {
        return Annotate(plan.status(), absl::StrCat("the planner was unreachable for ",
                                                     absl::FormatDuration(absl::Now() - outage_start)));
      }
      spdlog::warn("plan of iteration {}: planner unreachable ({}); asking again", iteration, plan.status().message());
      absl::SleepFor(absl::Milliseconds(200));
    } else if (code != absl::StatusCode::kDeadlineExceeded) {
      return plan;
    } else {
      spdlog::info("waiting for the plan of iteration {}", iteration);
    }
    if (stopped_()) return absl::AbortedError("job stopped while waiting for its plan");
    Start(iteration);
  }
}

}  // namespace dynapipe::runtime::executor
