#include "src/store/memory_plan_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dynapipe::store {

void MemoryPlanStore::Notify(const std::string& event) {
  MutexLock lock(&listener_mu_);
  if (listener_) listener_(event);
}

absl::StatusOr<std::string> MemoryPlanStore::CreateJob(const proto::JobSpec& spec, int64_t start_iteration,
                                                       int64_t now_ms) {
  if (start_iteration < 0) {
    return absl::InvalidArgumentError(absl::StrCat("start_iteration: ", start_iteration, " is negative"));
  }
  std::string id;
  {
    MutexLock lock(&mu_);
    id = absl::StrFormat("job-%s-%06d", store_id_, ++next_id_);
    Job& j = jobs_[id];
    j.spec = spec;
    j.submit_ms = j.update_ms = now_ms;
    j.start_iteration = start_iteration;
    if (start_iteration > 0) {
      for (int r = 0; r < WorldSize(spec); ++r) j.done[r] = start_iteration - 1;
    }
  }
  Notify("job " + id);
  return id;
}

absl::StatusOr<proto::JobStatus> MemoryPlanStore::GetJob(const std::string& job) {
  proto::JobStatus s;
  int world;
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return JobNotFound(job);
    const Job& j = it->second;
    s.set_job_id(job);
    *s.mutable_spec() = j.spec;
    s.set_state(j.state);
    s.set_error(j.error);
    s.set_submit_time_unix_ms(j.submit_ms);
    s.set_update_time_unix_ms(j.update_ms);
    s.set_plans_ready(j.planned);
    s.set_start_iteration(j.start_iteration);
    world = WorldSize(j.spec);
  }
  auto done = DoneByRank(job, world);
  if (!done.ok()) return done.status();
  s.set_iterations_done(*std::min_element(done->begin(), done->end()) + 1);
  return s;
}

absl::StatusOr<std::vector<std::string>> MemoryPlanStore::ListJobs() {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, j] : jobs_) out.push_back(id);
  return out;
}

absl::StatusOr<bool> MemoryPlanStore::SetJobState(const std::string& job, proto::JobState::Value state,
                                                  const std::string& error, int64_t now_ms) {
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return JobNotFound(job);
    Job& j = it->second;
    if (IsTerminal(j.state) || (j.state == state && j.error == error)) return false;
    if (state == proto::JobState::pending && j.state != proto::JobState::pending) return false;
    j.state = state;
    j.error = error;
    j.update_ms = now_ms;
  }
  Notify("job " + job);
  return true;
}

absl::StatusOr<bool> MemoryPlanStore::TryLease(const std::string& job, int64_t iteration, const std::string& owner,
                                               absl::Duration) {
  MutexLock lock(&mu_);
  auto& leases = jobs_[job].leases;
  return leases.emplace(iteration, owner).second;
}

absl::Status MemoryPlanStore::ReleaseLease(const std::string& job, int64_t iteration, const std::string& owner) {
  MutexLock lock(&mu_);
  auto& leases = jobs_[job].leases;
  if (auto it = leases.find(iteration); it != leases.end() && it->second == owner) leases.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<bool> MemoryPlanStore::CommitPlans(const std::string& job, int64_t iteration, const std::string& owner,
                                                  std::span<const proto::ExecutionPlan> plans, absl::Duration) {
  {
    MutexLock lock(&mu_);
    Job& j = jobs_[job];
    auto it = j.leases.find(iteration);
    if (it == j.leases.end() || it->second != owner || j.planned_set.contains(iteration)) return false;
    for (const auto& p : plans) j.plans[{iteration, p.rank()}] = p.SerializeAsString();
    j.planned_set.insert(iteration);
    ++j.writes[iteration];
    j.planned = std::max(j.planned, iteration);
  }
  Notify(absl::StrCat("plan ", job, " ", iteration));
  return true;
}

absl::StatusOr<bool> MemoryPlanStore::IsPlanned(const std::string& job, int64_t iteration) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  return it != jobs_.end() && it->second.planned_set.contains(iteration);
}

absl::StatusOr<proto::ExecutionPlan> MemoryPlanStore::GetPlan(const std::string& job, int64_t iteration, int rank) {
  std::string bytes;
  const std::string what = absl::StrCat("plan of job ", job, " iteration ", iteration, " rank ", rank);
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat(what, " not stored"));
    auto p = it->second.plans.find({iteration, rank});
    if (p == it->second.plans.end()) return absl::NotFoundError(absl::StrCat(what, " not stored"));
    bytes = p->second;
  }
  return DecodePlanFor(bytes, job, iteration, rank);
}

absl::StatusOr<int64_t> MemoryPlanStore::PlanWrites(const std::string& job, int64_t iteration) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return 0;
  auto w = it->second.writes.find(iteration);
  return w == it->second.writes.end() ? 0 : w->second;
}

absl::Status MemoryPlanStore::PutReport(const proto::IterationReport& report, absl::Duration) {
  {
    MutexLock lock(&mu_);
    Job& j = jobs_[report.job_id()];
    j.reports[{report.iteration(), report.rank()}] = report.SerializeAsString();
    auto [it, inserted] = j.done.emplace(report.rank(), report.iteration());
    it->second = std::max(it->second, report.iteration());
  }
  Notify("job " + report.job_id());
  return absl::OkStatus();
}

absl::Status MemoryPlanStore::PutHistory(const std::string& job, const proto::IterationSummary& summary) {
  MutexLock lock(&mu_);
  auto& h = jobs_[job].history;
  h[summary.iteration()] = summary;
  while (h.size() > static_cast<size_t>(kHistoryLimit)) h.erase(h.begin());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<proto::IterationSummary>> MemoryPlanStore::History(const std::string& job, int64_t from,
                                                                              int limit) {
  MutexLock lock(&mu_);
  std::vector<proto::IterationSummary> out;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return out;
  for (auto h = it->second.history.lower_bound(from); h != it->second.history.end() && static_cast<int>(out.size()) < limit;
       ++h) {
    out.push_back(h->second);
  }
  return out;
}

absl::Status MemoryPlanStore::AddFailure(const proto::IterationReport& report, absl::Duration) {
  {
    MutexLock lock(&mu_);
    jobs_[report.job_id()].failures.push_back(report);
  }
  Notify("job " + report.job_id());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<proto::IterationReport>> MemoryPlanStore::Failures(const std::string& job) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::vector<proto::IterationReport>{};
  return it->second.failures;
}

absl::StatusOr<std::vector<int64_t>> MemoryPlanStore::DoneByRank(const std::string& job, int world) {
  MutexLock lock(&mu_);
  std::vector<int64_t> out(world, -1);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return out;
  for (const auto& [r, d] : it->second.done) {
    if (r >= 0 && r < world) out[r] = d;
  }
  return out;
}

absl::StatusOr<proto::IterationReport> MemoryPlanStore::GetReport(const std::string& job, int64_t iteration, int rank) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end()) {
    if (auto r = it->second.reports.find({iteration, rank}); r != it->second.reports.end()) {
      proto::IterationReport report;
      report.ParseFromString(r->second);
      return report;
    }
  }
  return absl::NotFoundError(absl::StrCat("no report for job ", job, " iteration ", iteration, " rank ", rank));
}

absl::StatusOr<bool> MemoryPlanStore::MarkCheckpointShard(const std::string& job, const std::string& checkpoint_dir,
                                                          int64_t iteration, int rank, int world) {
  if (absl::Status s = CheckShardMark(checkpoint_dir, iteration, rank, world); !s.ok()) return s;
  MutexLock lock(&mu_);
  std::set<int>& ranks = jobs_[job].checkpoint_ranks[iteration];
  if (!ranks.insert(rank).second || static_cast<int>(ranks.size()) < world) return false;
  auto [it, inserted] = latest_checkpoint_.emplace(checkpoint_dir, iteration);
  it->second = std::max(it->second, iteration);
  return true;
}

absl::StatusOr<int64_t> MemoryPlanStore::LatestCheckpoint(const std::string& checkpoint_dir) {
  MutexLock lock(&mu_);
  auto it = latest_checkpoint_.find(checkpoint_dir);
  return it == latest_checkpoint_.end() ? -1 : it->second;
}

absl::StatusOr<bool> MemoryPlanStore::ClaimGang(const std::string& job, const std::vector<std::string>& executors) {
  if (executors.empty()) return absl::InvalidArgumentError("executors: a gang needs at least one");
  MutexLock lock(&mu_);
  auto& ranks = jobs_[job].ranks;
  for (size_t r = 0; r < executors.size(); ++r) {
    if (ranks.count(static_cast<int>(r)) > 0 || seats_.count(executors[r]) > 0) return false;
  }
  for (size_t r = 0; r < executors.size(); ++r) {
    ranks[static_cast<int>(r)] = executors[r];
    seats_[executors[r]] = Seat{job, static_cast<int>(r)};
  }
  return true;
}

absl::StatusOr<Seat> MemoryPlanStore::SeatOf(const std::string& executor) {
  MutexLock lock(&mu_);
  auto it = seats_.find(executor);
  return it == seats_.end() ? Seat{} : it->second;
}

absl::Status MemoryPlanStore::ReleaseSeat(const std::string& executor, const std::string& job) {
  MutexLock lock(&mu_);
  if (auto it = seats_.find(executor); it != seats_.end() && it->second.job == job) seats_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryPlanStore::RankHolder(const std::string& job, int rank) {
  MutexLock lock(&mu_);
  auto& ranks = jobs_[job].ranks;
  auto it = ranks.find(rank);
  return it == ranks.end() ? std::string() : it->second;
}

absl::Status MemoryPlanStore::PutExecutor(const proto::ExecutorRecord& record) {
  MutexLock lock(&mu_);
  executors_[record.executor_id()] = record;
  return absl::OkStatus();
}

absl::StatusOr<proto::ExecutorRecord> MemoryPlanStore::GetExecutor(const std::string& id) {
  MutexLock lock(&mu_);
  auto it = executors_.find(id);
  if (it == executors_.end()) return absl::NotFoundError(absl::StrCat("executor ", id, " not registered"));
  return it->second;
}

absl::StatusOr<std::vector<std::string>> MemoryPlanStore::ListExecutors() {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, r] : executors_) out.push_back(id);
  return out;
}

absl::Status MemoryPlanStore::DeleteExecutor(const std::string& id) {
  MutexLock lock(&mu_);
  executors_.erase(id);
  seats_.erase(id);
  return absl::OkStatus();
}

absl::Status MemoryPlanStore::SetBootstrap(const std::string& job, const std::string& key, const std::string& value) {
  {
    MutexLock lock(&mu_);
    jobs_[job].bootstrap[key] = value;
  }
  Notify(absl::StrCat("bootstrap ", job, " ", key));
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryPlanStore::GetBootstrap(const std::string& job, const std::string& key) {
  MutexLock lock(&mu_);
  auto& b = jobs_[job].bootstrap;
  auto it = b.find(key);
  if (it == b.end()) return absl::NotFoundError(absl::StrCat("bootstrap key ", key, " of job ", job, " not set"));
  return it->second;
}

void MemoryPlanStore::SetListener(std::function<void(const std::string& event)> listener) {
  MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

}  // namespace dynapipe::store
