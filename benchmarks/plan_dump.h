#pragma once

// Dumps what our executor would train on: the planner's micro-batches for a
// job's first iterations, assembled into TokenBatch-es by the worker's own
// code (runtime/model/batch.h), in the worker's execution order, with each
// iteration's loss scale and learning rate and the model's initial
// parameters (benchmarks/batch_dump.h).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "benchmarks/batch_dump.h"
#include "proto/job.pb.h"

namespace dynapipe::benchmarks {

// Iterations [0, iterations) of `spec` (dataset path relative to
// `data_root`). The job must have one rank (pp 1 x dp 1): the dump is one
// stage's view. INVALID_ARGUMENT otherwise, or for a spec the planner rejects.
absl::StatusOr<BatchDump> DumpPlans(const proto::JobSpec& spec, const std::string& data_root, int64_t iterations);

}  // namespace dynapipe::benchmarks
