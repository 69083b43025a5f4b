// PlannerService: what the status endpoint shows (/healthz, /status,
// /metrics; drawn by StatusView), gathered within the status budget.
#include <algorithm>

#include "planner/service/planner_service.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {

std::string PlannerService::HealthProblem() const {
  if (!store_->healthy()) return "plan store (Redis) unreachable";
  return "";
}

PlannerService::Snapshot PlannerService::StatusSnapshot() {
  absl::StatusOr<Snapshot> snap = AnswerWithinSync<Snapshot>(
      WithinOptions(),
      [this]() -> absl::StatusOr<Snapshot> {
        Snapshot s;
        ASSIGN_OR_RETURN(s.jobs, ReadJobs());
        ASSIGN_OR_RETURN(s.executors, registry_.Executors());
        return s;
      },
      [this](const absl::Status&) -> absl::StatusOr<Snapshot> {
        // Whatever is known, however old (nothing at all before the first read).
        Snapshot s;
        LastKnown::Jobs jobs = last_known_.AllJobs();
        LastKnown::Executors executors = last_known_.AllExecutors();
        s.jobs = std::move(jobs.jobs);
        s.executors = std::move(executors.executors);
        const absl::Time at = std::min(jobs.at, executors.at);
        s.stale_ms = at == absl::InfinitePast() ? absl::ToInt64Milliseconds(options_.clock->Now() - started_) + 1
                                                : StaleMs(at);
        return s;
      });
  return snap.ok() ? std::move(*snap) : Snapshot{};
}

StatusInputs PlannerService::StatusNow() {
  Snapshot snap = StatusSnapshot();
  StatusInputs in;
  in.jobs = std::move(snap.jobs);
  in.executors = std::move(snap.executors);
  in.stale_ms = snap.stale_ms;
  in.now_ms = NowMs();
  in.owner = options_.owner;
  in.healthy = HealthProblem().empty();
  in.redis_errors = store_->errors();
  {
    MutexLock lock(&store_id_mu_);
    in.store_id = store_id_;
    in.store_losses = store_losses_;
  }
  in.notice = LossNotice();
  return in;
}

std::string PlannerService::StatusJson() { return status_.Json(StatusNow()); }

std::string PlannerService::MetricsText() { return status_.MetricsText(StatusNow()); }

}  // namespace dynapipe::planner::service
