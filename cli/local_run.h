#pragma once

// Runs a job's ranks as threads of this process: plans from the planner
// library, workers talking over Gloo on loopback. The same code paths as the
// daemons minus RPC and Redis; used by the equivalence tests and the CPU
// throughput benchmark.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model/refit_cost_model.h"
#include "proto/job.pb.h"
#include "runtime/backend/backend.h"
#include "runtime/executor/worker.h"
#include "src/spec/job_spec.h"

namespace dynapipe::cli {

// A job's cost model at the end of a local run.
struct LocalJobModel {
  std::string description;  // the planner's cost model
  // With cost_refit on: the refit's terms (fitted: enough iterations seen)
  // and how many of the job's iterations it has seen.
  bool refit_fitted = false;
  planner::RefitTerms refit_terms;
  int refit_observed = 0;
};

struct LocalRunResult {
  std::vector<std::vector<runtime::executor::IterationResult>> per_rank;  // [rank][iteration]
  std::vector<double> predicted_ms;                    // per iteration
  std::vector<double> plan_ms;                         // per iteration: planning time
  std::vector<bool> refit_plan;                        // per iteration: planned with a refit cost model
  std::vector<bool> explore_plan;                      // per iteration: planned to explore (its prediction is off by design)
  std::vector<int> micro_batches;                      // per iteration, all dp groups together
  std::vector<std::string> plan_model;                 // per iteration: the cost model that planned it (Describe())
  std::vector<bool> own_split;                         // per iteration: dynamic chose its own split, not a baseline's
  std::vector<double> padding_efficiency;              // per iteration: real / computed tokens
  std::vector<std::vector<float>> final_params;        // per rank, chunks concatenated
  double wall_s = 0;  // iterations only (no setup; planning ahead with the refit on overlaps them)
  std::vector<double> done_s;  // per iteration: seconds from the ranks' start until the last rank ended it
  std::vector<LocalJobModel> models;  // per job (one but with RunLocalTurns): its cost model at the end
};

// One iteration of a run in turns: the job that plans it (an index into the
// specs) and the batch of that job's it trains on.
struct LocalTurn {
  int job = 0;
  int64_t batch = 0;
};

// Iterations [0, count) of `spec` (dataset paths relative to `data_root`),
// each rank on a backend of its own made from `backend` (the CPU by default;
// CUDA ranks share the one device). With cost_refit on, as in the planner
// daemon: the first planner_lookahead iterations are planned before the
// ranks start, iteration i + planner_lookahead once every rank has reported
// iteration i and the refit has seen it. Otherwise every plan is made first.
absl::StatusOr<LocalRunResult> RunLocal(const spec::NormalizedJobSpec& spec, const std::string& data_root,
                                        int64_t count, runtime::executor::WorkerOptions options = {},
                                        runtime::BackendOptions backend = {});
// The same from a spec as written (tests, benchmarks that edit a loaded
// spec): normalised here, where it enters.
absl::StatusOr<LocalRunResult> RunLocal(const proto::JobSpec& spec, const std::string& data_root, int64_t count,
                                        runtime::executor::WorkerOptions options = {}, runtime::BackendOptions backend = {});

// Jobs that differ only in how they batch (batching, cost_refit, the
// planner's knobs) taking turns on one set of ranks: iteration t is planned
// by job turns[t].job's planner, from its batch turns[t].batch, and trains
// the one model the ranks share. Each job keeps its own cost refit, fed only
// the iterations it planned, as in a run of its own. Lets a benchmark
// compare batching methods on the same batches in one process (neighbouring
// iterations share the machine's load). Nothing is exported.
// INVALID_ARGUMENT when the jobs differ in anything else or a turn names a
// job that is not there.
absl::StatusOr<LocalRunResult> RunLocalTurns(const std::vector<proto::JobSpec>& specs, const std::string& data_root,
                                             const std::vector<LocalTurn>& turns,
                                             runtime::executor::WorkerOptions options = {},
                                             runtime::BackendOptions backend = {});

}  // namespace dynapipe::cli
