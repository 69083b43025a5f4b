#pragma once

// Runs a job's ranks as threads of this process: plans from the planner
// library, workers talking over Gloo on loopback. The same code paths as the
// daemons minus RPC and Redis; used by the equivalence tests and the CPU
// throughput benchmark.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "runtime/backend/backend.h"
#include "runtime/executor/worker.h"

namespace dynapipe::runtime::executor {

struct LocalRunResult {
  std::vector<std::vector<IterationResult>> per_rank;  // [rank][iteration]
  std::vector<double> predicted_ms;                    // per iteration
  std::vector<int> micro_batches;                      // per iteration, all dp groups together
  std::vector<double> padding_efficiency;              // per iteration: real / computed tokens
  std::vector<std::vector<float>> final_params;        // per rank, chunks concatenated
  double wall_s = 0;                                   // iterations only (no planning, no setup)
};

// Iterations [0, count) of `spec` (dataset paths relative to `data_root`),
// each rank on a backend of its own made from `backend` (the CPU by default;
// CUDA ranks share the one device).
absl::StatusOr<LocalRunResult> RunLocal(const proto::JobSpec& spec, const std::string& data_root, int64_t count,
                                        WorkerOptions options = {}, BackendOptions backend = {});

}  // namespace dynapipe::runtime::executor
