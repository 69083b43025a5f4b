#pragma once

// Where a submitted job starts: iteration 0, or with checkpoint.resume after
// the latest complete checkpoint of checkpoint.dir (the store's record, else
// the shards on disk). Refuses what would overwrite checkpoints on disk.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "src/spec/job_spec.h"
#include "src/store/plan_store.h"

namespace dynapipe::planner::service {

struct StartPoint {
  int64_t iteration = 0;
  const char* source = "";  // where the checkpoint was found, for the log
};

// `data_root`: where a relative checkpoint.dir resolves (and what confines it).
// INVALID_ARGUMENT if no iteration is left to run; FAILED_PRECONDITION if
// the directory holds checkpoints the job would overwrite.
absl::StatusOr<StartPoint> StartOf(const spec::NormalizedJobSpec& spec, const std::string& data_root,
                                   store::PlanStore& store);

}  // namespace dynapipe::planner::service
