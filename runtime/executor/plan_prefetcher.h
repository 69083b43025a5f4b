#pragma once

// Fetches a job's execution plans ahead of the running iteration, so the
// next plan is in hand when an iteration ends (the planner plans ahead into
// Redis; FetchPlan waits for a plan up to its own deadline). A fetch that
// times out because the plan is not ready yet is simply asked again, until
// the job is stopped.
//
// Threads: Next() is called by one thread; fetches run on their own threads.

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/plan.pb.h"

namespace dynapipe::runtime::executor {

class PlanPrefetcher {
 public:
  // One bounded attempt to fetch the plan of `iteration` (DEADLINE_EXCEEDED:
  // not ready yet).
  using Fetch = std::function<absl::StatusOr<proto::ExecutionPlan>(int64_t iteration)>;

  // Plans of job `job` for rank `rank`, iterations [.., end), fetched up to
  // `depth` beyond the one asked for. `stopped` says the job ended elsewhere
  // (checked between attempts). A planner that cannot be reached
  // (UNAVAILABLE, or CANCELLED by its shutdown) is asked again until it has
  // been away `outage_grace` in a row: a restart is ridden through.
  PlanPrefetcher(std::string job, int rank, Fetch fetch, int64_t end, int depth, std::function<bool()> stopped,
                 absl::Duration outage_grace = absl::ZeroDuration());
  // Waits for the fetches still running (each is bounded).
  ~PlanPrefetcher();
  PlanPrefetcher(const PlanPrefetcher&) = delete;
  PlanPrefetcher& operator=(const PlanPrefetcher&) = delete;

  // The plan of `iteration`, starting fetches up to `iteration + depth`.
  // ABORTED once stopped; FAILED_PRECONDITION for a plan of another job,
  // rank or iteration than asked (a stale or misplaced plan is never run);
  // otherwise the fetch's own error.
  absl::StatusOr<proto::ExecutionPlan> Next(int64_t iteration);

 private:
  void Start(int64_t iteration);

  std::string job_;
  int rank_;
  Fetch fetch_;
  int64_t end_;
  int depth_;
  std::function<bool()> stopped_;
  absl::Duration outage_grace_;
  std::map<int64_t, std::future<absl::StatusOr<proto::ExecutionPlan>>> ahead_;
};

}  // namespace dynapipe::runtime::executor
