#include "planner/service/last_known.h"

#include "src/spec/job_state.h"

namespace dynapipe::planner::service {

void LastKnown::PutJob(const proto::JobStatus& status, absl::Time at) {
  MutexLock lock(&mu_);
  if (at < losses_.at) return;  // read from the store that lost its data
  Job& j = jobs_[status.job_id()];
  if (at < j.at) return;  // an older read finishing late
  j.status = status;
  j.status.clear_stale_ms();
  j.at = at;
}

void LastKnown::PutJobs(const std::vector<proto::JobStatus>& jobs, absl::Time at) {
  for (const proto::JobStatus& s : jobs) PutJob(s, at);
  MutexLock lock(&mu_);
  jobs_at_ = std::max(jobs_at_, at);
}

void LastKnown::PutExecutors(const std::vector<proto::ExecutorRecord>& executors, absl::Time at) {
  MutexLock lock(&mu_);
  if (at < executors_.at || at < losses_.at) return;
  executors_.executors = executors;
  executors_.at = at;
}

std::optional<LastKnown::Job> LastKnown::GetJob(const std::string& id) const {
  MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second;
}

LastKnown::Jobs LastKnown::AllJobs() const {
  MutexLock lock(&mu_);
  Jobs out;
  out.at = jobs_at_;
  for (const auto& [id, j] : jobs_) out.jobs.push_back(j.status);
  return out;
}

LastKnown::Executors LastKnown::AllExecutors() const {
  MutexLock lock(&mu_);
  return executors_;
}

void LastKnown::StoreLost(absl::Time at, const std::string& old_id, const std::string& new_id) {
  MutexLock lock(&mu_);
  losses_.at = at;
  for (auto& [id, j] : jobs_) {
    if (!spec::IsTerminal(j.status.state())) ++losses_.unfinished;
    if (lost_.count(id) == 0) lost_order_.push_back(id);
    lost_[id] = LostJob{std::move(j.status), at, old_id, new_id};
  }
  jobs_.clear();
  jobs_at_ = absl::InfinitePast();
  executors_ = Executors();
  while (lost_order_.size() > kMaxLost) {
    lost_.erase(lost_order_.front());
    lost_order_.pop_front();
  }
}

std::optional<LastKnown::LostJob> LastKnown::GetLost(const std::string& id) const {
  MutexLock lock(&mu_);
  auto it = lost_.find(id);
  if (it == lost_.end()) return std::nullopt;
  return it->second;
}

LastKnown::LossSummary LastKnown::Losses() const {
  MutexLock lock(&mu_);
  return losses_;
}

}  // namespace dynapipe::planner::service
