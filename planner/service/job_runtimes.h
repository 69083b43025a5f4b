#pragma once

// The jobs this planner process has loaded: each job's planner and global
// batches (JobRuntime), built from its stored spec on first use and dropped
// once the job ended (they are the bulk of a job's memory here). Own lock.

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "planner/service/job_runtime.h"
#include "src/common/mutex.h"
#include "src/store/plan_store.h"

namespace dynapipe::planner::service {

class JobRuntimes {
 public:
  JobRuntimes(store::PlanStore* store, std::string data_root) : store_(store), data_root_(std::move(data_root)) {}

  // The job's runtime, built from the store's spec if not loaded.
  // FAILED_PRECONDITION for a job that ended (none is built: a job cancelled
  // after its state was read is not loaded again).
  absl::StatusOr<std::shared_ptr<const JobRuntime>> Get(const std::string& job);
  // Keeps `rt` as job's runtime (built for its submission) unless one is loaded.
  void Adopt(const std::string& job, std::shared_ptr<const JobRuntime> rt);
  // The job's runtime if loaded here, else null (nothing is built).
  std::shared_ptr<const JobRuntime> Loaded(const std::string& job) const;
  // Drops the runtimes of jobs that ended or are gone from the store; a plan
  // being made keeps its own reference until it is stored.
  void ReleaseEnded();
  size_t size() const;

 private:
  store::PlanStore* const store_;
  const std::string data_root_;
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const JobRuntime>> loaded_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynapipe::planner::service
