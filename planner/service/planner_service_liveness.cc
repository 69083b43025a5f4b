// PlannerService: liveness of jobs and executors, bootstrap, watch (the
// executors themselves: executor_registry.cc; the status endpoint:
// planner_service_status.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/service/planner_service.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {

absl::StatusOr<std::vector<proto::JobStatus>> PlannerService::JobsInOrder() {
  // Read as status calls read them: this pass also keeps the last known
  // state fresh for when the store stalls.
  ASSIGN_OR_RETURN(std::vector<proto::JobStatus> jobs, ReadJobs());
  // Submission order: ids are increasing numbers.
  std::sort(jobs.begin(), jobs.end(), [](const proto::JobStatus& x, const proto::JobStatus& y) {
    const std::string &a = x.job_id(), &b = y.job_id();
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return jobs;
}

void PlannerService::CheckStoreIdentity() {
  const absl::StatusOr<std::string> id = store_->StoreId();
  if (!id.ok()) return;  // unreachable: judged once it answers again
  MutexLock lock(&store_id_mu_);
  if (!store_id_.empty() && *id != store_id_) {
    ++store_losses_;
    last_known_.StoreLost(options_.clock->Now(), store_id_, *id);
    spdlog::error("the plan store (Redis) lost its data: its id was {} and is now {} (restarted without its "
                  "append-only file, or flushed). Every job submitted before is gone; resubmit with "
                  "checkpoint.resume to continue from the checkpoints on disk. Job ids are never reused.",
                  store_id_, *id);
  }
  store_id_ = *id;
}

void PlannerService::CheckLiveness() {
  CheckStoreIdentity();
  // Jobs and executors are read once per pass, for placement and for the checks below.
  const absl::StatusOr<std::vector<proto::JobStatus>> jobs = JobsInOrder();
  auto records = registry_.Executors();
  if (jobs.ok() && records.ok()) {
    if (auto s = registry_.PlaceWaitingJobs(*jobs, &*records); !s.ok()) spdlog::warn("placing jobs: {}", s.message());
  }
  // Pending jobs whose ranks are all held start (also covers a claimer whose
  // own start attempt failed); running jobs with failures are judged.
  for (const proto::JobStatus& job : jobs.ok() ? *jobs : std::vector<proto::JobStatus>()) {
    const std::string& id = job.job_id();
    if (job.state() == proto::JobState::pending) (void)registry_.MaybeStartJob(id, store::WorldSize(job.spec()));
    if (job.state() != proto::JobState::running) {
      progress_.erase(id);
      continue;
    }
    CheckProgress(id, job);
    // Failures reported long enough ago are judged with what has arrived.
    auto failures = store_->Failures(id);
    if (!failures.ok() || failures->empty() ||
        NowMs() - failures->front().received_unix_ms() < absl::ToInt64Milliseconds(options_.failure_grace)) {
      continue;
    }
    if (auto s = JudgeJobFailures(id, *failures, store::WorldSize(job.spec()), /*final=*/true); !s.ok()) {
      spdlog::warn("job {}: judging failures: {}", id, s.message());
    }
  }
  // Right after this process starts, heartbeats may be stale only because no
  // planner was running; during and right after a store outage, because
  // heartbeats could not be recorded: give executors one timeout to check in.
  // Only unreachability counts (error replies such as WRONGTYPE do not: they
  // would switch loss detection off for good).
  if (!store_->healthy()) store_trouble_at_ = options_.clock->Now();
  store_trouble_at_ = std::max(store_trouble_at_, store_->last_trouble());  // also a stall that has ended
  const absl::Time grace_from = std::max(started_, store_trouble_at_);
  if (options_.clock->Now() - grace_from < options_.heartbeat_timeout) return;
  if (!records.ok()) return;
  registry_.MarkLost(&*records);
}

void PlannerService::CheckProgress(const std::string& job, const proto::JobStatus& status) {
  const absl::Time now = options_.clock->Now();
  auto [it, fresh] = progress_.try_emplace(job, Progress{status.iterations_done(), now});
  Progress& p = it->second;
  if (fresh || status.iterations_done() != p.done) {
    p = {status.iterations_done(), now};
    return;
  }
  // While the store is in trouble, reports could not be recorded either.
  if (now - std::max(p.since, store_trouble_at_) < options_.progress_timeout) return;
  const std::string why = absl::StrFormat(
      "no progress for %s: iteration %d not completed by every rank (--progress-timeout-s)",
      absl::FormatDuration(absl::Trunc(now - p.since, absl::Seconds(1))), status.iterations_done());
  auto changed = store_->SetJobState(job, proto::JobState::failed, why, NowMs());
  if (changed.ok() && *changed) spdlog::error("job {} failed: {}", job, why);
}

void PlannerService::LivenessLoop() {
  const absl::Duration period = std::max(absl::Milliseconds(50), options_.heartbeat_timeout / 4);
  absl::Time last_pass = absl::InfinitePast();  // real time: this thread's own stalls
  while (!stopping_) {
    // A pass long overdue means this process was not running (SIGSTOP, a
    // swapped-out or starved machine): heartbeats were not being taken, so
    // executors get a heartbeat timeout from now before anyone is judged lost.
    const absl::Time pass = absl::Now();
    if (last_pass != absl::InfinitePast() && pass - last_pass > 2 * period + absl::Seconds(1)) {
      spdlog::warn("liveness check {} ms late (this planner was stalled): executors get {} ms to check in",
                   absl::ToInt64Milliseconds(pass - last_pass - period),
                   absl::ToInt64Milliseconds(options_.heartbeat_timeout));
      store_trouble_at_ = options_.clock->Now();
    }
    last_pass = pass;
    CheckLiveness();
    runtimes_.ReleaseEnded();
    for (absl::Duration slept; slept < period && !stopping_; slept += absl::Milliseconds(50)) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
}

// ---- Bootstrap ----

absl::Status PlannerService::BootstrapSet(const proto::BootstrapSetRequest& req) {
  if (req.job_id().empty() || req.key().empty()) return absl::InvalidArgumentError("job_id and key: must be set");
  RETURN_IF_ERROR(store_->GetJob(req.job_id()).status());
  return store_->SetBootstrap(req.job_id(), req.key(), req.value());
}

void PlannerService::BootstrapGet(const proto::BootstrapGetRequest& req, absl::Time deadline,
                                  std::function<void(absl::StatusOr<std::string>)> done) {
  if (auto job = store_->GetJob(req.job_id()); !job.ok()) return done(job.status());
  auto v = store_->GetBootstrap(req.job_id(), req.key());
  if (v.ok() || v.status().code() != absl::StatusCode::kNotFound) return done(std::move(v));
  auto shared = std::make_shared<std::function<void(absl::StatusOr<std::string>)>>(std::move(done));
  PlanWait w;
  w.key = absl::StrCat("bootstrap ", req.job_id(), " ", req.key());
  w.deadline = deadline;
  w.check = [this, req, shared]() {
    auto got = store_->GetBootstrap(req.job_id(), req.key());
    if (!got.ok() && got.status().code() == absl::StatusCode::kNotFound) return false;
    (*shared)(std::move(got));
    return true;
  };
  w.expire = [req, shared](absl::Status why) {
    (*shared)(why.code() == absl::StatusCode::kDeadlineExceeded
                  ? absl::DeadlineExceededError(absl::StrCat("bootstrap key ", req.key(), " of job ", req.job_id(),
                                                             " not set before the deadline"))
                  : why);
  };
  waiters_.Add(std::move(w));
}

// ---- Watch ----

void PlannerService::Watch(const std::string& job, std::function<bool(const proto::JobEvent&)> push,
                           std::function<void(absl::Status)> finish) {
  auto state = std::make_shared<int64_t>(-1);  // last iterations_done sent with a report
  // The stream outlives store outages the job rides through: a store that
  // cannot be read now (UNAVAILABLE) is read again at the next event or timer.
  auto send = [this, job, push, finish, state]() {
    auto s = store_->GetJob(job);
    if (!s.ok() && s.status().code() == absl::StatusCode::kUnavailable && !stopping_) return false;
    if (!s.ok()) {
      finish(s.status());
      return true;
    }
    proto::JobEvent event;
    FillLastIteration(&*s);
    *event.mutable_status() = *s;
    if (s->iterations_done() > 0 && s->iterations_done() - 1 != *state) {
      auto report = store_->GetReport(job, s->iterations_done() - 1, 0);
      if (report.ok()) *event.mutable_last_report() = std::move(*report);
      *state = s->iterations_done() - 1;
    }
    if (!push(event) || store::IsTerminal(s->state())) {
      finish(absl::OkStatus());
      return true;
    }
    return false;
  };
  if (send()) return;
  PlanWait w;
  w.key = "job " + job;
  w.deadline = absl::InfiniteFuture();
  w.check = send;
  w.expire = [finish](absl::Status why) { finish(why); };
  waiters_.Add(std::move(w));
}

}  // namespace dynapipe::planner::service
