#include "runtime/executor/plan_prefetcher.h"

#include "absl/strings/str_cat.h"
#include "src/common/logging.h"

namespace dynapipe::runtime::executor {

PlanPrefetcher::PlanPrefetcher(std::string job, int rank, Fetch fetch, int64_t end, int depth,
                               std::function<bool()> stopped)
    : job_(std::move(job)),
      rank_(rank),
      fetch_(std::move(fetch)),
      end_(end),
      depth_(std::max(0, depth)),
      stopped_(std::move(stopped)) {}

PlanPrefetcher::~PlanPrefetcher() {
  for (auto& [i, f] : ahead_) f.wait();
}

void PlanPrefetcher::Start(int64_t iteration) {
  if (iteration >= end_ || ahead_.contains(iteration)) return;
  ahead_[iteration] = std::async(std::launch::async, [this, iteration] { return fetch_(iteration); });
}

absl::StatusOr<proto::ExecutionPlan> PlanPrefetcher::Next(int64_t iteration) {
  for (int64_t k = iteration; k <= iteration + depth_; ++k) Start(k);
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
    if (plan.status().code() != absl::StatusCode::kDeadlineExceeded) return plan;
    if (stopped_()) return absl::AbortedError("job stopped while waiting for its plan");
    spdlog::info("waiting for the plan of iteration {}", iteration);
    Start(iteration);
  }
}

}  // namespace dynapipe::runtime::executor
