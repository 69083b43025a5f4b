#include "planner/service/planner_service.h"

#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/service/failures.h"
#include "planner/service/job_start.h"
#include "planner/service/metric_buckets.h"
#include "src/common/checkpoint_layout.h"
#include "src/common/file_util.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"
#include "src/spec/job_spec.h"

namespace dynapipe::planner::service {
namespace {

// The job's checkpoint dir as the store keys it: "/ckpt/run/" and "/ckpt/run"
// are one directory. Empty if the job has none.
std::string CheckpointDir(const proto::JobSpec& spec) {
  std::string dir = spec.checkpoint().dir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

}  // namespace

PlannerService::PlannerService(store::PlanStore* store, ServiceOptions options)
    : store_(store),
      options_(std::move(options)),
      runtimes_(store_, options_.data_root),
      status_(&metrics_, &runtimes_),
      waiters_(options_.clock, options_.recheck),
      scheduler_(store_, &runtimes_, &metrics_,
                 {options_.owner, options_.lease_ttl, options_.plan_ttl, options_.recheck, options_.clock}),
      registry_(store_, &last_known_, [this] { return JobsInOrder(); },
                {options_.heartbeat_interval, options_.heartbeat_timeout, options_.lost_executor_ttl, options_.clock}),
      store_pool_(options_.store_threads) {
  if (options_.owner.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    options_.owner = absl::StrFormat("%s-%d-%08x", host, ::getpid(), std::random_device{}());
  }
  store_->SetListener([this](const std::string& e) { OnEvent(e); });
}

PlannerService::~PlannerService() {
  Stop();
  store_->SetListener(nullptr);
}

void PlannerService::Start() {
  started_ = options_.clock->Now();
  auto start = [this](std::function<void()> loop) {
    {
      MutexLock lock(&threads_mu_);
      ++threads_running_;
    }
    threads_.emplace_back([this, loop = std::move(loop)] {
      loop();
      MutexLock lock(&threads_mu_);
      --threads_running_;
    });
  };
  for (int i = 0; i < std::max(1, options_.planning_threads); ++i) start([this] { scheduler_.Run(); });
  start([this] { waiters_.Run(); });
  start([this] { LivenessLoop(); });
}

void PlannerService::Stop() {
  if (stopping_.exchange(true)) return;
  scheduler_.Stop();
  waiters_.Stop();
  {
    // Threads finish what they are doing (a plan's commit, a lease's
    // release) unless the store keeps them waiting: then their store calls
    // are cut short, so a stalled Redis cannot hold up the exit.
    MutexLock lock(&threads_mu_);
    if (!threads_mu_.AwaitWithDeadline([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return threads_running_ == 0; },
                                       absl::Now() + kStopGrace)) {
      spdlog::warn("the store holds up the planner's threads: cutting its calls short");
      store_->Shutdown();
    }
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Calls still waiting are answered now, not left hanging.
  waiters_.ExpireAll();
}

void PlannerService::OnEvent(const std::string& event) {
  waiters_.Notify(event);
  scheduler_.Wake();
}


// ---- JobService ----



absl::StatusOr<proto::SubmitJobResponse> PlannerService::Submit(const proto::SubmitJobRequest& req) {
  // Everything that can be wrong with the job is found before it is stored,
  // and what is stored has every default written out.
  ASSIGN_OR_RETURN(const spec::NormalizedJobSpec normalized, spec::NormalizedJobSpec::Normalize(req.spec()));
  // Validated by building what planning it needs (reading the dataset once):
  // kept for the job once it has an id.
  ASSIGN_OR_RETURN(const std::shared_ptr<const JobRuntime> validated,
                   BuildJobRuntime(normalized, "validation", options_.data_root));
  ASSIGN_OR_RETURN(const StartPoint start, StartOf(normalized, options_.data_root, *store_));
  const proto::JobSpec& spec = normalized.proto();
  ASSIGN_OR_RETURN(std::string id, store_->CreateJob(spec, start.iteration, NowMs()));
  runtimes_.Adopt(id, ForJob(*validated, id));
  registry_.JobSubmitted();
  spdlog::info("job {} submitted: {} ({} iterations, pp {} x dp {})", id, spec.name(), spec.iterations(),
               spec.parallelism().pp(), spec.parallelism().dp());
  if (spec.checkpoint().resume()) {
    if (start.iteration > 0) {
      spdlog::info("job {} resumes from the checkpoint of iteration {} in {} ({}): starts at iteration {}", id,
                   start.iteration - 1, spec.checkpoint().dir(), start.source, start.iteration);
    } else {
      spdlog::info("job {}: no complete checkpoint in {}; starts at iteration 0 ({})", id, spec.checkpoint().dir(),
                   *start.source != '\0' ? start.source : "none on disk");
    }
  }
  metrics_.Add("dynapipe_jobs_submitted_total", 1, "Jobs accepted by Submit");
  proto::SubmitJobResponse resp;
  resp.set_job_id(id);
  return resp;
}

absl::StatusOr<proto::JobStatus> PlannerService::Get(const proto::GetJobRequest& req) {
  if (req.job_id().empty()) return absl::InvalidArgumentError("job_id: must be set");
  const absl::Time at = options_.clock->Now();
  absl::StatusOr<proto::JobStatus> s = store_->GetJob(req.job_id());
  if (s.status().code() == absl::StatusCode::kNotFound) {
    if (std::string hint = LostJobHint(req.job_id()); !hint.empty()) return absl::NotFoundError(hint);
  }
  if (!s.ok()) return s.status();
  FillLastIteration(&*s);
  last_known_.PutJob(*s, at);
  return s;
}

absl::StatusOr<std::vector<proto::JobStatus>> PlannerService::ReadJobs() {
  const absl::Time at = options_.clock->Now();
  ASSIGN_OR_RETURN(const auto ids, store_->ListJobs());
  std::vector<proto::JobStatus> jobs;
  for (const auto& id : ids) {
    // A job that ended changes no more.
    if (auto known = last_known_.GetJob(id); known && store::IsTerminal(known->status.state())) {
      jobs.push_back(std::move(known->status));
      continue;
    }
    auto s = store_->GetJob(id);
    if (s.status().code() == absl::StatusCode::kUnavailable) return s.status();  // not N more timeouts
    if (!s.ok()) continue;
    FillLastIteration(&*s);
    jobs.push_back(std::move(*s));
  }
  last_known_.PutJobs(jobs, at);
  return jobs;
}

absl::StatusOr<proto::ListJobsResponse> PlannerService::List(const proto::ListJobsRequest&) {
  ASSIGN_OR_RETURN(std::vector<proto::JobStatus> jobs, ReadJobs());
  proto::ListJobsResponse resp;
  for (auto& s : jobs) *resp.add_jobs() = std::move(s);
  resp.set_notice(LossNotice());
  return resp;
}

// ---- Answers within a budget, from the last known state if need be ----

bool PlannerService::Offload(std::function<void()> call) {
  return store_pool_.TrySchedule(std::move(call), options_.max_queued_calls);
}

AnswerWithinOptions PlannerService::WithinOptions() {
  AnswerWithinOptions o;
  o.pool = &store_pool_;
  o.timers = &timers_;
  o.budget = options_.status_budget;
  o.max_queued = options_.max_queued_calls;
  return o;
}

int64_t PlannerService::StaleMs(absl::Time at) const {
  return std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.clock->Now() - at));
}

namespace {
absl::Status NothingKnown(const absl::Status& why, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("the plan store (Redis) did not answer (", why.message(),
                                             ") and this planner has no last known state of ", what));
}
}  // namespace

void PlannerService::GetWithin(proto::GetJobRequest req, std::function<void(absl::StatusOr<proto::JobStatus>)> done) {
  AnswerWithin<proto::JobStatus>(
      WithinOptions(), [this, req] { return Get(req); },
      [this, id = req.job_id()](const absl::Status& why) -> absl::StatusOr<proto::JobStatus> {
        if (auto known = last_known_.GetJob(id)) {
          known->status.set_stale_ms(StaleMs(known->at));
          return std::move(known->status);
        }
        if (std::string hint = LostJobHint(id); !hint.empty()) return absl::NotFoundError(hint);
        return NothingKnown(why, absl::StrCat("job ", id));
      },
      std::move(done));
}

void PlannerService::ListWithin(std::function<void(absl::StatusOr<proto::ListJobsResponse>)> done) {
  AnswerWithin<proto::ListJobsResponse>(
      WithinOptions(), [this] { return List({}); },
      [this](const absl::Status& why) -> absl::StatusOr<proto::ListJobsResponse> {
        LastKnown::Jobs known = last_known_.AllJobs();
        if (known.at == absl::InfinitePast()) return NothingKnown(why, "the jobs");
        proto::ListJobsResponse resp;
        resp.set_stale_ms(StaleMs(known.at));
        for (auto& s : known.jobs) {
          s.set_stale_ms(resp.stale_ms());
          *resp.add_jobs() = std::move(s);
        }
        resp.set_notice(LossNotice());
        return resp;
      },
      std::move(done));
}

void PlannerService::ExecutorsWithin(std::function<void(absl::StatusOr<proto::ListExecutorsResponse>)> done) {
  AnswerWithin<proto::ListExecutorsResponse>(
      WithinOptions(),
      [this]() -> absl::StatusOr<proto::ListExecutorsResponse> {
        ASSIGN_OR_RETURN(std::vector<proto::ExecutorRecord> records, registry_.Executors());
        proto::ListExecutorsResponse resp;
        for (auto& r : records) *resp.add_executors() = std::move(r);
        return resp;
      },
      [this](const absl::Status& why) -> absl::StatusOr<proto::ListExecutorsResponse> {
        LastKnown::Executors known = last_known_.AllExecutors();
        if (known.at == absl::InfinitePast()) return NothingKnown(why, "the executors");
        proto::ListExecutorsResponse resp;
        resp.set_stale_ms(StaleMs(known.at));
        for (auto& r : known.executors) *resp.add_executors() = std::move(r);
        return resp;
      },
      std::move(done));
}

std::string PlannerService::LostJobHint(const std::string& job) {
  const std::optional<LastKnown::LostJob> lost = last_known_.GetLost(job);
  if (!lost) return "";
  const proto::JobSpec& spec = lost->last.spec();
  std::string resume;
  const std::string& dir = spec.checkpoint().dir();
  const int world = spec.parallelism().pp() * spec.parallelism().dp();
  if (dir.empty()) {
    resume = "it wrote no checkpoints (checkpoint.dir unset): resubmitting its job file starts it over";
  } else if (auto on_disk = ConfinedPath(options_.data_root, dir); !on_disk.ok()) {
    resume = absl::StrCat("its checkpoint.dir ", dir, " cannot be read here: ", on_disk.status().message());
  } else if (auto latest = checkpoint_layout::LatestCompleteOnDisk(*on_disk, world); !latest.ok() || *latest < 0) {
    resume = absl::StrCat("no complete checkpoint is on disk in ", dir, ": resubmitting its job file starts it over");
  } else {
    resume = absl::StrCat("resubmit its job file with checkpoint.resume: true to continue from iteration ",
                          *latest + 1, " (checkpoint on disk in ", dir, ")");
  }
  return absl::StrCat("job ", job, " was lost with the plan store's data, found at ",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", lost->at, absl::UTCTimeZone()), " (store id ",
                      lost->old_store, " -> ", lost->new_store, ": Redis restarted empty or was flushed); it was ",
                      proto::JobState::Value_Name(lost->last.state()), " at iteration ", lost->last.iterations_done(),
                      "/", spec.iterations(), "; ", resume);
}

std::string PlannerService::LossNotice() const {
  const LastKnown::LossSummary losses = last_known_.Losses();
  if (losses.unfinished == 0) return "";
  return absl::StrCat(losses.unfinished, " unfinished job(s) were lost with the plan store's data (found at ",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", losses.at, absl::UTCTimeZone()),
                      "); `dynapipe status JOB` tells how to resume each");
}

absl::StatusOr<proto::CancelJobResponse> PlannerService::Cancel(const proto::CancelJobRequest& req) {
  ASSIGN_OR_RETURN(const proto::JobStatus s, store_->GetJob(req.job_id()));
  if (store::IsTerminal(s.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", req.job_id(), " already ended (",
                                                      proto::JobState::Value_Name(s.state()), ")"));
  }
  RETURN_IF_ERROR(store_->SetJobState(req.job_id(), proto::JobState::cancelled, "cancelled by user", NowMs()).status());
  spdlog::info("job {} cancelled", req.job_id());
  return proto::CancelJobResponse();
}

// ---- PlanService ----

void PlannerService::FetchPlan(const proto::FetchPlanRequest& req, absl::Time deadline, FetchDone done) {
  const absl::Time start = options_.clock->Now();
  auto record = [this, start](const absl::StatusOr<proto::ExecutionPlan>& r) {
    metrics_.Observe("dynapipe_fetch_plan_latency_seconds", absl::ToDoubleSeconds(options_.clock->Now() - start),
                     kLatencyBuckets, "FetchPlan latency, including waits");
    if (!r.ok()) metrics_.Add("dynapipe_fetch_plan_errors_total", 1, "FetchPlan calls that failed");
  };
  // Fast path, one Redis round trip: a stored plan answers at once (it can
  // only exist for a valid job, iteration and rank).
  auto plan = store_->GetPlan(req.job_id(), req.iteration(), req.rank());
  if (plan.ok() || plan.status().code() != absl::StatusCode::kNotFound) {
    record(plan);
    return done(std::move(plan));
  }
  auto status = store_->GetJob(req.job_id());
  if (!status.ok()) return done(status.status());
  const int world = store::WorldSize(status->spec());
  if (req.rank() < 0 || req.rank() >= world) {
    return done(absl::InvalidArgumentError(absl::StrCat("rank: ", req.rank(), " is not a rank of job ", req.job_id(),
                                                        " (0..", world - 1, ")")));
  }
  // A resumed job has no plans before its start iteration.
  if (req.iteration() < status->start_iteration() || req.iteration() >= status->spec().iterations()) {
    return done(absl::InvalidArgumentError(absl::StrCat("iteration: ", req.iteration(), " is outside job ",
                                                        req.job_id(), " (", status->start_iteration(), "..",
                                                        status->spec().iterations() - 1, ")")));
  }
  if (store::IsTerminal(status->state())) {
    return done(absl::FailedPreconditionError(absl::StrCat("job ", req.job_id(), " ended (",
                                                           proto::JobState::Value_Name(status->state()), ")")));
  }
  // Plans are committed with their iteration's "planned" mark in one step:
  // a mark without the plan means it expired or was deleted, and waiting
  // would only run out the caller's deadline.
  if (auto planned = store_->IsPlanned(req.job_id(), req.iteration()); planned.ok() && *planned) {
    auto again = store_->GetPlan(req.job_id(), req.iteration(), req.rank());
    if (again.ok() || again.status().code() != absl::StatusCode::kNotFound) {
      record(again);
      return done(std::move(again));
    }
    const absl::Status lost = absl::DataLossError(absl::StrCat("plan of job ", req.job_id(), " iteration ",
                                                               req.iteration(), " rank ", req.rank(),
                                                               " is marked planned but missing from the store"));
    record(lost);
    return done(lost);
  }
  auto shared_done = std::make_shared<FetchDone>(std::move(done));
  PlanWait w;
  w.key = absl::StrCat("plan ", req.job_id(), " ", req.iteration());
  w.deadline = deadline;
  w.check = [this, req, shared_done, record]() {
    auto p = store_->GetPlan(req.job_id(), req.iteration(), req.rank());
    if (!p.ok() && p.status().code() == absl::StatusCode::kNotFound) {
      // The job may have ended while this call waited: answer now.
      auto job = store_->GetJob(req.job_id());
      if (!job.ok() || !store::IsTerminal(job->state())) return false;
      p = absl::FailedPreconditionError(absl::StrCat("job ", req.job_id(), " ended (",
                                                     proto::JobState::Value_Name(job->state()), ")"));
    }
    record(p);
    (*shared_done)(std::move(p));
    return true;
  };
  w.expire = [req, shared_done, record](absl::Status why) {
    absl::StatusOr<proto::ExecutionPlan> r =
        why.code() == absl::StatusCode::kDeadlineExceeded
            ? absl::DeadlineExceededError(absl::StrCat("plan of job ", req.job_id(), " iteration ", req.iteration(),
                                                       " rank ", req.rank(), " not ready before the deadline"))
            : why;
    record(r);
    (*shared_done)(std::move(r));
  };
  waiters_.Add(std::move(w));
}

absl::Status PlannerService::ReportIteration(const proto::IterationReport& report) {
  ASSIGN_OR_RETURN(const proto::JobStatus before, store_->GetJob(report.job_id()));
  const int world = store::WorldSize(before.spec());
  if (report.rank() < 0 || report.rank() >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", report.rank(), " is not a rank of job ", report.job_id()));
  }
  if (report.iteration() < before.start_iteration() || report.iteration() >= before.spec().iterations()) {
    return absl::InvalidArgumentError(absl::StrCat("iteration: ", report.iteration(), " is outside job ",
                                                   report.job_id(), " (", before.start_iteration(), "..",
                                                   before.spec().iterations() - 1, ")"));
  }
  if (!report.error().empty()) {
    // An executor could not run its part: the job cannot go on. Which rank
    // caused it may take the other ranks' reports to tell.
    proto::IterationReport failure = report;
    failure.set_received_unix_ms(NowMs());
    RETURN_IF_ERROR(store_->AddFailure(failure, options_.plan_ttl));
    metrics_.Add("dynapipe_executor_failures_total", 1, "Failures executors reported");
    spdlog::warn("job {}: {}", report.job_id(), report.error());
    ASSIGN_OR_RETURN(const std::vector<proto::IterationReport> failures, store_->Failures(report.job_id()));
    return JudgeJobFailures(report.job_id(), failures, world, /*final=*/false);
  }
  RETURN_IF_ERROR(store_->PutReport(report, options_.plan_ttl));
  if (report.checkpoint_written()) {
    const std::string dir = CheckpointDir(before.spec());
    if (dir.empty()) {
      spdlog::warn("job {} rank {} reports a checkpoint of iteration {}, but the job has no checkpoint.dir: ignored",
                   report.job_id(), report.rank(), report.iteration());
    } else {
      // Retried reports are harmless: a rank counts once per iteration.
      ASSIGN_OR_RETURN(const bool complete,
                       store_->MarkCheckpointShard(report.job_id(), dir, report.iteration(), report.rank(), world));
      metrics_.Add("dynapipe_checkpoint_shards_total", 1, "Checkpoint shards executors reported written");
      if (complete) {
        metrics_.Add("dynapipe_checkpoints_complete_total", 1, "Checkpoints whose every rank's shard is written");
        spdlog::info("job {}: checkpoint of iteration {} complete in {} ({} ranks)", report.job_id(),
                     report.iteration(), dir, world);
      }
    }
  }
  scheduler_.Refit(report, world);
  const http::Labels job_label = {{"job", report.job_id()}};
  metrics_.Add("dynapipe_iterations_reported_total", 1, "ReportIteration calls", job_label);
  metrics_.Add("dynapipe_tokens_total", static_cast<double>(report.tokens()), "Real tokens reported by executors",
               job_label);
  if (report.iteration_ms() > 0) {
    metrics_.Observe("dynapipe_iteration_seconds", report.iteration_ms() / 1e3, kIterationBuckets,
                     "Measured iteration time per rank", job_label);
  }
  ASSIGN_OR_RETURN(const proto::JobStatus after, store_->GetJob(report.job_id()));
  // The iterations this report completed join the job's history (another
  // rank's concurrent report may write the same ones: a rewrite replaces).
  // From this report's own iteration when it came late or again (a retry
  // after an error past PutReport), so no iteration is left out.
  const int64_t first = std::max(std::min(before.iterations_done(), report.iteration()), after.start_iteration());
  for (int64_t it = first; it < after.iterations_done(); ++it) {
    RecordHistory(after, it);
  }
  if (after.iterations_done() >= after.spec().iterations() && !store::IsTerminal(after.state())) {
    RETURN_IF_ERROR(store_->SetJobState(report.job_id(), proto::JobState::succeeded, "", NowMs()).status());
    spdlog::info("job {} succeeded after {} iterations", report.job_id(), after.iterations_done());
  }
  return absl::OkStatus();
}


absl::Status PlannerService::JudgeJobFailures(const std::string& job,
                                              const std::vector<proto::IterationReport>& failures, int world,
                                              bool final) {
  const FailureVerdict verdict = JudgeFailures(failures, world, final);
  if (!verdict.decided) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool changed, store_->SetJobState(job, proto::JobState::failed, verdict.error, NowMs()));
  if (changed) spdlog::error("job {} failed: {}", job, verdict.error);
  return absl::OkStatus();
}




}  // namespace dynapipe::planner::service
