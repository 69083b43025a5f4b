#include "planner/service/executor_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/service/gang_placement.h"
#include "src/common/logging.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {
namespace {

constexpr size_t kMaxNodeBytes = 255;  // a host name's limit

}  // namespace

void ExecutorRegistry::JobSubmitted() {
  // The next idle executor's heartbeat places it, whenever the last pass was.
  MutexLock lock(&mu_);
  jobs_may_wait_ = true;
  last_eager_schedule_ = absl::InfinitePast();
}

absl::StatusOr<proto::RegisterExecutorResponse> ExecutorRegistry::Register(const proto::RegisterExecutorRequest& req) {
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

absl::StatusOr<proto::ExecutorRecord> ExecutorRegistry::AuthenticateExecutor(const rpc::ExecutorCredential& caller) {
  if (caller.executor_id.empty()) return rpc::MissingExecutorCredential();
  ASSIGN_OR_RETURN(proto::ExecutorRecord rec, store_->GetExecutor(caller.executor_id));
  if (!rpc::ExecutorSecretMatches(caller.secret, rec.secret_sha256())) {
    spdlog::warn("refused a call as executor {}: wrong secret", caller.executor_id);
    return absl::UnauthenticatedError(
        absl::StrCat(rpc::kExecutorCredentialKey, ": wrong secret for executor ", caller.executor_id));
  }
  return rec;
}

absl::Status ExecutorRegistry::AuthorizeHeartbeat(const rpc::ExecutorCredential& caller,
                                                const proto::HeartbeatRequest& req) {
  if (!caller.executor_id.empty() && caller.executor_id != req.executor_id()) {
    spdlog::warn("refused a heartbeat for executor {} from executor {}", req.executor_id(), caller.executor_id);
    return absl::PermissionDeniedError(
        absl::StrCat("executor_id: ", req.executor_id(), " is not the calling executor (", caller.executor_id, ")"));
  }
  return AuthenticateExecutor(caller).status();
}

absl::Status ExecutorRegistry::AuthorizeReport(const rpc::ExecutorCredential& caller,
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

absl::Status ExecutorRegistry::AuthorizeJobMember(const rpc::ExecutorCredential& caller, const std::string& job) {
  ASSIGN_OR_RETURN(const proto::ExecutorRecord rec, AuthenticateExecutor(caller));
  if (job.empty() || rec.assignment().job_id() != job) {
    spdlog::warn("refused bootstrap data of job {} to executor {}, which is not assigned to it", job,
                 caller.executor_id);
    return absl::PermissionDeniedError(absl::StrCat("job_id: ", job, " is not the job of the calling executor (",
                                                    caller.executor_id, ")"));
  }
  return absl::OkStatus();
}

absl::Status ExecutorRegistry::MaybeAssign(proto::ExecutorRecord* rec) {
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

absl::Status ExecutorRegistry::ScheduleGangs(bool eager) {
  // One pass at a time in this process; passes of other planners are safe:
  // each claim is atomic in the store.
  MutexLock lock(&mu_);
  // An idle executor's heartbeat runs a pass only while jobs may wait, and
  // at most every kEagerScheduleInterval: a pass reads every job.
  if (eager) {
    if (!jobs_may_wait_ || absl::Now() - last_eager_schedule_ < kEagerScheduleInterval) return absl::OkStatus();
    last_eager_schedule_ = absl::Now();
  }
  ASSIGN_OR_RETURN(const std::vector<proto::JobStatus> jobs, read_jobs_());
  return PlaceLocked(jobs, nullptr);
}

absl::Status ExecutorRegistry::PlaceWaitingJobs(const std::vector<proto::JobStatus>& jobs,
                                                const std::vector<proto::ExecutorRecord>* records) {
  MutexLock lock(&mu_);
  return PlaceLocked(jobs, records);
}

absl::Status ExecutorRegistry::PlaceLocked(const std::vector<proto::JobStatus>& jobs,
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

absl::StatusOr<bool> ExecutorRegistry::MaybeStartJob(const std::string& job, int world) {
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

absl::StatusOr<proto::HeartbeatResponse> ExecutorRegistry::Heartbeat(const proto::HeartbeatRequest& req) {
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

absl::StatusOr<std::vector<proto::ExecutorRecord>> ExecutorRegistry::Executors() {
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
  last_known_->PutExecutors(out, at);
  return out;
}

void ExecutorRegistry::MarkLost(std::vector<proto::ExecutorRecord>* records) {
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

}  // namespace dynapipe::planner::service
