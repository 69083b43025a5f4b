#pragma once

// What a planner process needs to plan a job's iterations: the Planner built
// from the JobSpec (cost model from the job's profile, or analytic from its
// device) and the job's global batches (sample lengths from the dataset).
// Built once per job per process; immutable afterwards but for the cost
// refit, which is thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/partition/batch.h"
#include "planner/planner.h"
#include "planner/service/job_refit.h"
#include "proto/job.pb.h"
#include "src/spec/job_spec.h"

namespace dynapipe::planner::service {

struct JobRuntime {
  explicit JobRuntime(spec::NormalizedJobSpec s) : spec(std::move(s)) {}
  spec::NormalizedJobSpec spec;
  std::shared_ptr<const Planner> planner;  // on the job's base cost model
  std::shared_ptr<JobRefit> refit;         // null when cost_refit.mode is off
  std::vector<std::vector<Sample>> batches;  // iteration i uses batches[i % size]
  int world() const { return planner->config().pp * planner->config().dp; }
  const std::vector<Sample>& batch(int64_t iteration) const { return batches[iteration % batches.size()]; }
  // The planner to plan `iteration` with: the latest refit's, else the base one.
  std::shared_ptr<const Planner> PlannerFor(int64_t iteration) const {
    return refit ? refit->PlannerFor(iteration) : planner;
  }
};

// Confines the spec's paths to `data_root` (spec::ConfineJobPaths), loads
// the dataset's lengths (checking the model's vocabulary covers an indexed
// dataset's) and builds the planner; INVALID_ARGUMENT names the field.
absl::StatusOr<std::shared_ptr<const JobRuntime>> BuildJobRuntime(const spec::NormalizedJobSpec& spec,
                                                                 const std::string& job_id,
                                                                 const std::string& data_root);

// `rt` (built before its job had an id, to validate a submission) for job
// `job_id`: the same spec, pipeline model and batches, with a fresh cost refit.
std::shared_ptr<const JobRuntime> ForJob(const JobRuntime& rt, const std::string& job_id);

}  // namespace dynapipe::planner::service
