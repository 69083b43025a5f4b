#pragma once

// Planning ahead: each planning thread claims the next iteration some active
// job needs (a lease in the store, so several planner processes share the
// work), plans it with the job's planner (the cost refit's, once it has one),
// commits the plans and releases the lease. Reports feed the job's cost
// refit here too. Own lock: the event epoch that wakes idle threads.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "planner/service/job_runtimes.h"
#include "proto/report.pb.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"
#include "src/http/metrics.h"
#include "src/store/plan_store.h"

namespace dynapipe::planner::service {

struct SchedulerOptions {
  std::string owner;  // this process in leases
  absl::Duration lease_ttl;
  absl::Duration plan_ttl;  // stored plans expire
  absl::Duration recheck;   // an idle thread re-scans even without events
  Clock* clock = Clock::Real();
};

class PlanningScheduler {
 public:
  PlanningScheduler(store::PlanStore* store, JobRuntimes* runtimes, http::Metrics* metrics, SchedulerOptions options)
      : store_(store), runtimes_(runtimes), metrics_(metrics), options_(std::move(options)) {}

  // One planning thread's loop, until Stop.
  void Run();
  // Something changed in the store (a report, a new job): idle threads re-scan.
  void Wake();
  void Stop();

  // Feeds an iteration's report to the job's cost refit, when the refit is on
  // and this process has the job loaded, and updates its gauges.
  void Refit(const proto::IterationReport& report, int world);

 private:
  // Claims the next iteration some active job needs; false if none.
  bool ClaimWork(std::string* job, int64_t* iteration, std::shared_ptr<const JobRuntime>* rt);
  void PlanOne(const std::string& job, int64_t iteration, const JobRuntime& rt);
  int64_t NowMs() const { return absl::ToUnixMillis(options_.clock->Now()); }

  store::PlanStore* const store_;
  JobRuntimes* const runtimes_;
  http::Metrics* const metrics_;
  const SchedulerOptions options_;
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by Wake and Stop
};

}  // namespace dynapipe::planner::service
