// PlannerService: executor registry, identity and liveness, bootstrap, watch
// (the status endpoint: planner_service_status.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/service/gang_placement.h"
#include "planner/service/planner_service.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {
namespace {

constexpr size_t kMaxNodeBytes = 255;  // a host name's limit


}  // namespace

absl::StatusOr<proto::RegisterExecutorResponse> PlannerService::Register(const proto::RegisterExecutorRequest& req) {
  // The node is part of the id, which executors send back in call metadata:
  // printable ASCII only.
  if (req.node().empty() || req.node().size() > kMaxNodeBytes ||
      !std::all_of(req.node().begin(), req.node().end(), [](char c) { return c > ' ' && c < 0x7f; })) {
    return absl::InvalidArgumentError(absl::StrCat("node: must be 1 to ", kMaxNodeBytes,
                                                   " printable ASCII characters without spaces"));
  }
  if (req.device_index() < 0) return absl::InvalidArgumentError("device_index: must not be negative");
  if (!proto::Backend::Value_IsValid(req.backend())) {
    return absl::InvalidArgumentError(absl::StrCat("backend: ", static_cast<int>(req.backend()),
                                                   " is not a backend (cpu = 1, cuda = 2)"));
  }
  // 64 random bits: an id cannot be guessed, nor collide with (and so take
  // over the record of) another executor's.
  ASSIGN_OR_RETURN(const std::string suffix, rpc::RandomHex(16));
  ASSIGN_OR_RETURN(const std::string secret, rpc::NewExecutorSecret());
  proto::ExecutorRecord rec;
  rec.set_executor_id(absl::StrCat("exec-", req.node(), "-", req.device_index(), "-", suffix));
  *rec.mutable_info() = req;
  rec.set_registered_unix_ms(NowMs());
  rec.set_last_heartbeat_unix_ms(NowMs());
  rec.set_last_iteration(-1);
  rec.set_secret_sha256(rpc::HashExecutorSecret(secret));
  RETURN_IF_ERROR(store_->PutExecutor(rec));
  spdlog::info("executor {} registered ({} device {}, {})", rec.executor_id(), req.node(), req.device_index(),
               proto::Backend::Value_Name(req.backend()));
  proto::RegisterExecutorResponse resp;
  resp.set_executor_id(rec.executor_id());
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  resp.set_executor_secret(secret);
  return resp;
}

absl::StatusOr<proto::ExecutorRecord> PlannerService::AuthenticateExecutor(const rpc::ExecutorCredential& caller) {
  if (caller.executor_id.empty()) return rpc::MissingExecutorCredential();
  ASSIGN_OR_RETURN(proto::ExecutorRecord rec, store_->GetExecutor(caller.executor_id));
  if (!rpc::ExecutorSecretMatches(caller.secret, rec.secret_sha256())) {
    spdlog::warn("refused a call as executor {}: wrong secret", caller.executor_id);
    return absl::UnauthenticatedError(
        absl::StrCat(rpc::kExecutorCredentialKey, ": wrong secret for executor ", caller.executor_id));
  }
  return rec;
}

absl::Status PlannerService::AuthorizeHeartbeat(const rpc::ExecutorCredential& caller,
                                                const proto::HeartbeatRequest& req) {
  if (!caller.executor_id.empty() && caller.executor_id != req.executor_id()) {
    spdlog::warn("refused a heartbeat for executor {} from executor {}", req.executor_id(), caller.executor_id);
    return absl::PermissionDeniedError(
        absl::StrCat("executor_id: ", req.executor_id(), " is not the calling executor (", caller.executor_id, ")"));
  }
  return AuthenticateExecutor(caller).status();
}

absl::Status PlannerService::AuthorizeReport(const rpc::ExecutorCredential& caller,
                                             const proto::IterationReport& report) {
  RETURN_IF_ERROR(AuthenticateExecutor(caller).status());
  // Rank claims are never reassigned within a job, so the claim decides, also
  // for a report (a checkpoint shard written in the background) that arrives
  // after the job ended and the executor went idle.
  ASSIGN_OR_RETURN(const std::string holder, store_->RankHolder(report.job_id(), report.rank()));
  if (holder != caller.executor_id) {
    spdlog::warn("refused a report for job {} rank {} from executor {}, which does not hold it", report.job_id(),
                 report.rank(), caller.executor_id);
    return absl::PermissionDeniedError(absl::StrCat("rank: ", report.rank(), " of job ", report.job_id(),
                                                    " is not held by the calling executor (", caller.executor_id,
                                                    ")"));
  }
  return absl::OkStatus();
}

absl::Status PlannerService::AuthorizeJobMember(const rpc::ExecutorCredential& caller, const std::string& job) {
  ASSIGN_OR_RETURN(const proto::ExecutorRecord rec, AuthenticateExecutor(caller));
  if (job.empty() || rec.assignment().job_id() != job) {
    spdlog::warn("refused bootstrap data of job {} to executor {}, which is not assigned to it", job,
                 caller.executor_id);
    return absl::PermissionDeniedError(absl::StrCat("job_id: ", job, " is not the job of the calling executor (",
                                                    caller.executor_id, ")"));
  }
  return absl::OkStatus();
}

absl::Status PlannerService::MaybeAssign(proto::ExecutorRecord* rec) {
  if (!rec->assignment().job_id().empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(store::Seat seat, store_->SeatOf(rec->executor_id()));
  if (seat.job.empty()) {
    // Stored first, so that this pass counts the executor as live and idle.
    RETURN_IF_ERROR(store_->PutExecutor(*rec));
    // A failed pass must not fail this executor's heartbeat: the next pass retries.
    if (absl::Status s = ScheduleGangs(/*eager=*/true); !s.ok()) spdlog::warn("placing jobs: {}", s.message());
    ASSIGN_OR_RETURN(seat, store_->SeatOf(rec->executor_id()));
    if (seat.job.empty()) return absl::OkStatus();
  }
  auto job = store_->GetJob(seat.job);
  if (!job.ok() && job.status().code() != absl::StatusCode::kNotFound) return job.status();
  if (!job.ok() || store::IsTerminal(job->state())) {
    // Its job ended before it took the seat (cancelled while waiting).
    return store_->ReleaseSeat(rec->executor_id(), seat.job);
  }
  const int pp = std::max(1, job->spec().parallelism().pp()), dp = std::max(1, job->spec().parallelism().dp());
  proto::Assignment* a = rec->mutable_assignment();
  a->set_job_id(seat.job);
  a->set_rank(seat.rank);
  a->set_world_size(pp * dp);
  a->set_pp_rank(seat.rank % pp);
  a->set_dp_rank(seat.rank / pp);
  a->set_start_iteration(job->iterations_done());
  spdlog::info("executor {} takes rank {} of job {}", rec->executor_id(), seat.rank, seat.job);
  // Record the assignment before anything else can fail.
  RETURN_IF_ERROR(store_->PutExecutor(*rec));
  return MaybeStartJob(seat.job, pp * dp).status();
}

absl::Status PlannerService::ScheduleGangs(bool eager) {
  // One pass at a time in this process; passes of other planners are safe:
  // each claim is atomic in the store.
  MutexLock lock(&schedule_mu_);
  // An idle executor's heartbeat runs a pass only while jobs may wait, and
  // at most every kEagerScheduleInterval: a pass reads every job.
  if (eager) {
    if (!jobs_may_wait_ || absl::Now() - last_eager_schedule_ < kEagerScheduleInterval) return absl::OkStatus();
    last_eager_schedule_ = absl::Now();
  }
  ASSIGN_OR_RETURN(const std::vector<proto::JobStatus> jobs, JobsInOrder());
  return PlaceWaitingJobs(jobs, nullptr);
}

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

absl::Status PlannerService::PlaceWaitingJobs(const std::vector<proto::JobStatus>& jobs,
                                              const std::vector<proto::ExecutorRecord>* records) {
  jobs_may_wait_ = false;
  std::vector<PendingJob> pending;
  for (const proto::JobStatus& job : jobs) {
    if (job.state() != proto::JobState::pending) continue;
    ASSIGN_OR_RETURN(const std::string holder, store_->RankHolder(job.job_id(), 0));
    if (!holder.empty()) continue;  // placed: its executors take their seats at their next heartbeat
    pending.push_back({job.job_id(), store::WorldSize(job.spec())});
  }
  if (pending.empty()) return absl::OkStatus();
  jobs_may_wait_ = true;
  std::vector<proto::ExecutorRecord> read;
  if (records == nullptr) {
    ASSIGN_OR_RETURN(read, Executors());
    records = &read;
  }
  const int64_t now = NowMs(), timeout = absl::ToInt64Milliseconds(options_.heartbeat_timeout);
  const int64_t fresh = std::min(timeout, std::max<int64_t>(1000, 3 * absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  std::vector<IdleExecutor> idle;
  int live = 0;
  for (const proto::ExecutorRecord& rec : *records) {
    if (rec.lost() || now - rec.last_heartbeat_unix_ms() > timeout) continue;
    ++live;
    // Placed only if it checked in within a few heartbeat intervals: the
    // record of an executor that just died (or was restarted under a new id)
    // stays live for a whole timeout, and a job placed on it would fail.
    if (now - rec.last_heartbeat_unix_ms() > fresh) continue;
    // Registered but never heard from since: nothing shows it is running (a
    // registration alone would let anyone holding the token take ranks).
    if (rec.heartbeats() == 0) continue;
    if (!rec.assignment().job_id().empty()) continue;
    ASSIGN_OR_RETURN(const store::Seat seat, store_->SeatOf(rec.executor_id()));
    if (seat.job.empty()) idle.push_back({rec.executor_id(), rec.info().node(), rec.info().device_index()});
  }
  for (const GangPlacement& p : PlaceGangs(pending, std::move(idle), live)) {
    if (p.executors.empty()) {
      RETURN_IF_ERROR(store_->SetJobState(p.job, proto::JobState::pending, p.waiting, now).status());
      continue;
    }
    ASSIGN_OR_RETURN(const bool claimed, store_->ClaimGang(p.job, p.executors));
    if (claimed) {
      spdlog::info("job {} placed on {} executors: {}", p.job, p.executors.size(), absl::StrJoin(p.executors, " "));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PlannerService::MaybeStartJob(const std::string& job, int world) {
  for (int k = 0; k < world; ++k) {
    ASSIGN_OR_RETURN(const std::string holder, store_->RankHolder(job, k));
    if (holder.empty()) return false;
  }
  ASSIGN_OR_RETURN(const proto::JobStatus status, store_->GetJob(job));
  if (status.state() != proto::JobState::pending) return false;
  ASSIGN_OR_RETURN(const bool changed, store_->SetJobState(job, proto::JobState::running, "", NowMs()));
  if (changed) spdlog::info("job {} running: all {} ranks assigned", job, world);
  return changed;
}

absl::StatusOr<proto::HeartbeatResponse> PlannerService::Heartbeat(const proto::HeartbeatRequest& req) {
  ASSIGN_OR_RETURN(proto::ExecutorRecord rec, store_->GetExecutor(req.executor_id()));
  proto::HeartbeatResponse resp;
  rec.set_last_heartbeat_unix_ms(NowMs());
  rec.set_last_iteration(req.iteration());
  rec.set_heartbeats(rec.heartbeats() + 1);
  // The first heartbeat makes the executor placeable: stored before the
  // placement below reads the records.
  if (rec.heartbeats() == 1) RETURN_IF_ERROR(store_->PutExecutor(rec));
  if (!rec.assignment().job_id().empty()) {
    auto job = store_->GetJob(rec.assignment().job_id());
    // A Redis error is not a reason to stop a running executor: report it.
    if (!job.ok() && job.status().code() != absl::StatusCode::kNotFound) return job.status();
    if (!job.ok() || store::IsTerminal(job->state()) || rec.lost()) {
      resp.set_stop(true);  // the job ended (or this executor was given up on): stop, then idle
      RETURN_IF_ERROR(store_->ReleaseSeat(rec.executor_id(), rec.assignment().job_id()));
      rec.clear_assignment();
      rec.set_lost(false);
    }
  } else {
    rec.set_lost(false);
    RETURN_IF_ERROR(MaybeAssign(&rec));
  }
  if (!rec.assignment().job_id().empty() && rec.assignment().peer_executor_ids_size() == 0) {
    std::vector<std::string> peers;
    for (int k = 0; k < rec.assignment().world_size(); ++k) {
      ASSIGN_OR_RETURN(std::string holder, store_->RankHolder(rec.assignment().job_id(), k));
      if (holder.empty()) {
        peers.clear();
        break;
      }
      peers.push_back(std::move(holder));
    }
    for (auto& p : peers) rec.mutable_assignment()->add_peer_executor_ids(p);
  }
  RETURN_IF_ERROR(store_->PutExecutor(rec));
  *resp.mutable_assignment() = rec.assignment();
  return resp;
}

absl::StatusOr<std::vector<proto::ExecutorRecord>> PlannerService::Executors() {
  const absl::Time at = options_.clock->Now();
  ASSIGN_OR_RETURN(const auto ids, store_->ListExecutors());
  std::vector<proto::ExecutorRecord> out;
  for (const auto& id : ids) {
    auto rec = store_->GetExecutor(id);
    if (rec.status().code() == absl::StatusCode::kUnavailable) return rec.status();  // not N more timeouts
    if (!rec.ok()) continue;
    rec->clear_secret_sha256();
    out.push_back(std::move(*rec));
  }
  last_known_.PutExecutors(out, at);
  return out;
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
  auto records = Executors();
  if (jobs.ok() && records.ok()) {
    MutexLock lock(&schedule_mu_);
    if (auto s = PlaceWaitingJobs(*jobs, &*records); !s.ok()) spdlog::warn("placing jobs: {}", s.message());
  }
  // Pending jobs whose ranks are all held start (also covers a claimer whose
  // own start attempt failed); running jobs with failures are judged.
  for (const proto::JobStatus& job : jobs.ok() ? *jobs : std::vector<proto::JobStatus>()) {
    const std::string& id = job.job_id();
    if (job.state() == proto::JobState::pending) (void)MaybeStartJob(id, store::WorldSize(job.spec()));
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
  const int64_t now = NowMs();
  const int64_t timeout = absl::ToInt64Milliseconds(options_.heartbeat_timeout);
  const int64_t ttl = absl::ToInt64Milliseconds(options_.lost_executor_ttl);
  for (proto::ExecutorRecord& rec : *records) {
    if (rec.lost() && now - rec.last_heartbeat_unix_ms() > ttl) {
      if (store_->DeleteExecutor(rec.executor_id()).ok()) {
        spdlog::info("executor {} forgotten: lost for {} s", rec.executor_id(), (now - rec.last_heartbeat_unix_ms()) / 1000);
      }
      continue;
    }
    if (rec.lost() || now - rec.last_heartbeat_unix_ms() <= timeout) continue;
    // Re-read: a heartbeat may have landed since the listing.
    auto fresh = store_->GetExecutor(rec.executor_id());
    if (!fresh.ok() || fresh->lost() || now - fresh->last_heartbeat_unix_ms() <= timeout) continue;
    rec = std::move(*fresh);
    rec.set_lost(true);
    if (!store_->PutExecutor(rec).ok()) continue;
    spdlog::warn("executor {} lost: no heartbeat for {} ms", rec.executor_id(), now - rec.last_heartbeat_unix_ms());
    // Its job: the one it runs, or the one it was placed in and had not
    // joined yet.
    store::Seat seat{rec.assignment().job_id(), rec.assignment().rank()};
    if (seat.job.empty()) {
      auto placed = store_->SeatOf(rec.executor_id());
      if (placed.ok()) seat = *placed;
    }
    if (seat.job.empty()) continue;
    const std::string why = absl::StrFormat("rank %d lost: executor %s on %s missed heartbeats for %.1f s",
                                            seat.rank, rec.executor_id(), rec.info().node(),
                                            (now - rec.last_heartbeat_unix_ms()) / 1e3);
    auto changed = store_->SetJobState(seat.job, proto::JobState::failed, why, now);
    if (changed.ok() && *changed) spdlog::error("job {} failed: {}", seat.job, why);
  }
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
