#include "planner/service/job_runtimes.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "src/common/status_macros.h"

namespace dynapipe::planner::service {

absl::StatusOr<std::shared_ptr<const JobRuntime>> JobRuntimes::Get(const std::string& job) {
  if (auto rt = Loaded(job)) return rt;
  ASSIGN_OR_RETURN(const proto::JobStatus status, store_->GetJob(job));
  if (store::IsTerminal(status.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job, " has ended (", proto::JobState::Value_Name(status.state()), ")"));
  }
  // A stored spec is normalised where it is loaded (a planner of another
  // version may have stored it).
  ASSIGN_OR_RETURN(const spec::NormalizedJobSpec spec, spec::NormalizedJobSpec::Normalize(status.spec()));
  ASSIGN_OR_RETURN(auto rt, BuildJobRuntime(spec, job, data_root_));
  MutexLock lock(&mu_);
  return loaded_.emplace(job, std::move(rt)).first->second;
}

void JobRuntimes::Adopt(const std::string& job, std::shared_ptr<const JobRuntime> rt) {
  MutexLock lock(&mu_);
  loaded_.emplace(job, std::move(rt));
}

std::shared_ptr<const JobRuntime> JobRuntimes::Loaded(const std::string& job) const {
  MutexLock lock(&mu_);
  auto it = loaded_.find(job);
  return it != loaded_.end() ? it->second : nullptr;
}

void JobRuntimes::ReleaseEnded() {
  std::vector<std::string> ids;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, rt] : loaded_) ids.push_back(id);
  }
  for (const std::string& id : ids) {
    auto s = store_->GetJob(id);
    const bool ended = s.ok() ? store::IsTerminal(s->state()) : s.status().code() == absl::StatusCode::kNotFound;
    if (!ended) continue;
    MutexLock lock(&mu_);
    loaded_.erase(id);
  }
}

size_t JobRuntimes::size() const {
  MutexLock lock(&mu_);
  return loaded_.size();
}

}  // namespace dynapipe::planner::service
