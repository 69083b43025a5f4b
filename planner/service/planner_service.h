#pragma once

// The planner daemon's logic, free of gRPC types. PlannerService is the job
// registry (submit, status, cancel, reports, history, watch, bootstrap) and
// wires the parts that each do one job under their own lock: JobRuntimes
// (jobs loaded here), PlanningScheduler (plans ahead), PlanWaiters (calls
// that wait), ExecutorRegistry (executors, gangs, liveness) and StatusView
// (/status, /metrics). State lives in the PlanStore (Redis), so several
// processes can serve the same jobs and a restarted process resumes them.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/service/executor_registry.h"
#include "planner/service/job_runtimes.h"
#include "planner/service/last_known.h"
#include "planner/service/plan_waiters.h"
#include "planner/service/planning_scheduler.h"
#include "planner/service/status_view.h"
#include "proto/services.pb.h"
#include "src/common/answer_within.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"
#include "src/common/thread_pool.h"
#include "src/common/timer_thread.h"
#include "src/http/metrics.h"
#include "src/rpc/defaults.h"
#include "src/rpc/executor_credential.h"
#include "src/store/plan_store.h"

namespace dynapipe::planner::service {

struct ServiceOptions {
  std::string owner;  // this process's id in leases; default: host-pid-random
  std::string data_root;  // relative dataset paths resolve here
  int planning_threads = 2;
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration plan_ttl = absl::Hours(1);     // stored plans and reports expire
  absl::Duration heartbeat_interval = rpc::kDefaultHeartbeatInterval;
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Records of executors lost this long are dropped (an executor that comes
  // back registers again).
  absl::Duration lost_executor_ttl = absl::Minutes(10);
  // After a rank reports a failure, how long to wait for the other ranks'
  // reports before judging which rank caused it (failures.h).
  absl::Duration failure_grace = absl::Seconds(3);
  // A running job whose completed iterations do not advance this long fails,
  // naming the iteration it is stuck at: no job stays "running" forever.
  absl::Duration progress_timeout = absl::Minutes(30);
  absl::Duration recheck = absl::Milliseconds(500);  // waiters re-check even without events
  // Workers that run the calls touching the store, off gRPC's threads, and
  // how many calls may wait for one before the next is refused
  // (RESOURCE_EXHAUSTED): a stalled store holds up workers, not the server.
  int store_threads = 16;
  size_t max_queued_calls = 4096;
  // Status calls (Get, List, Executors, /status, /metrics) answer within
  // this: from the store when it answers in time, else from the last known
  // state, marked stale.
  absl::Duration status_budget = AnswerWithinOptions().budget;
  Clock* clock = Clock::Real();
};

class PlannerService {
 public:
  PlannerService(store::PlanStore* store, ServiceOptions options);
  ~PlannerService();  // stops the background threads (drains in-flight planning)
  PlannerService(const PlannerService&) = delete;
  PlannerService& operator=(const PlannerService&) = delete;

  // Background work: planning workers, executor liveness, waiter timers.
  void Start();
  // Final. Answers waiting calls and stops the background threads; those the
  // store keeps waiting longer than kStopGrace have their store calls cut
  // short (PlanStore::Shutdown), so a stalled store cannot hold up the exit.
  void Stop();
  static constexpr absl::Duration kStopGrace = absl::Milliseconds(500);

  // Runs `call` on the store workers (ServiceOptions::store_threads); false
  // when max_queued_calls already wait: the caller refuses the call.
  bool Offload(std::function<void()> call);
  // Get, List and Executors within options.status_budget: from the store if
  // it answers in time, else from the planner's last known state with
  // stale_ms set (UNAVAILABLE if it knows nothing to answer with). `done`
  // runs once, on a worker or timer thread, or on this one.
  void GetWithin(proto::GetJobRequest req, std::function<void(absl::StatusOr<proto::JobStatus>)> done);
  void ListWithin(std::function<void(absl::StatusOr<proto::ListJobsResponse>)> done);
  void ExecutorsWithin(std::function<void(absl::StatusOr<proto::ListExecutorsResponse>)> done);

  // JobService. Submit normalises the spec (spec::NormalizedJobSpec),
  // validates it by building its runtime (kept for the job) and stores it. With checkpoint.resume the job starts after the latest
  // complete checkpoint of checkpoint.dir: the store's record, else the shards
  // on disk (INVALID_ARGUMENT if no iteration is left). A job that would
  // overwrite checkpoints already in its dir is refused (FAILED_PRECONDITION).
  absl::StatusOr<proto::SubmitJobResponse> Submit(const proto::SubmitJobRequest& req);
  // Get and List read the store. A job lost with the store's data (Redis
  // restarted empty) is NOT_FOUND saying so, when, and how to resume it.
  absl::StatusOr<proto::JobStatus> Get(const proto::GetJobRequest& req);
  absl::StatusOr<proto::ListJobsResponse> List(const proto::ListJobsRequest& req);
  absl::StatusOr<proto::CancelJobResponse> Cancel(const proto::CancelJobRequest& req);
  // The job's history (NOT_FOUND for an unknown job) and one iteration's
  // plans and reports (NOT_FOUND once they expired).
  absl::StatusOr<proto::GetIterationsResponse> GetIterations(const proto::GetIterationsRequest& req);
  absl::StatusOr<proto::GetIterationResponse> GetIteration(const proto::GetIterationRequest& req);

  // PlanService. FetchPlan answers now if the plan exists, else calls `done`
  // once it does or at `deadline` (DEADLINE_EXCEEDED). `done` may run on
  // this thread or a background one.
  using FetchDone = std::function<void(absl::StatusOr<proto::ExecutionPlan>)>;
  void FetchPlan(const proto::FetchPlanRequest& req, absl::Time deadline, FetchDone done);
  // Stores the report; a report with checkpoint_written marks the rank's shard
  // (the checkpoint is complete once every rank's is).
  absl::Status ReportIteration(const proto::IterationReport& report);

  // ExecutorRegistry: registration, identity, heartbeats, placement.
  ExecutorRegistry& executors() { return registry_; }

  // Bootstrap. Get waits for the key like FetchPlan.
  absl::Status BootstrapSet(const proto::BootstrapSetRequest& req);
  void BootstrapGet(const proto::BootstrapGetRequest& req, absl::Time deadline,
                    std::function<void(absl::StatusOr<std::string>)> done);

  // Watch: `push` receives the job's status now, on every change and at least
  // every second, until it returns false or the job ends; then `finish`.
  void Watch(const std::string& job, std::function<bool(const proto::JobEvent&)> push,
             std::function<void(absl::Status)> finish);

  // Status endpoint (StatusView): answers within options.status_budget,
  // from the last known state (with its age) when the store is slow.
  std::string HealthProblem() const;  // "" when healthy
  std::string StatusJson();
  std::string MetricsText();
  http::Metrics& metrics() { return metrics_; }
  const std::string& owner() const { return options_.owner; }

 private:
  // Sets last_loss and last_iteration_ms from the latest stored report.
  void FillLastIteration(proto::JobStatus* s);
  // Every job in the store, filled (FillLastIteration) and remembered in
  // last_known_; jobs known to have ended come from there, unread.
  absl::StatusOr<std::vector<proto::JobStatus>> ReadJobs();
  // What NOT_FOUND says about a job lost with the store's data, or "".
  std::string LostJobHint(const std::string& job);
  // The notice ListJobsResponse carries after a store lost jobs, or "".
  std::string LossNotice() const;
  AnswerWithinOptions WithinOptions();
  // Milliseconds since `at` (at least 1: stale_ms > 0 marks staleness).
  int64_t StaleMs(absl::Time at) const;
  // Jobs and executors for /status and /metrics, within status_budget.
  struct Snapshot {
    std::vector<proto::JobStatus> jobs;
    std::vector<proto::ExecutorRecord> executors;
    int64_t stale_ms = 0;  // > 0: from the last known state
  };
  Snapshot StatusSnapshot();
  // The snapshot with the store's health and identity, for StatusView.
  StatusInputs StatusNow();
  void OnEvent(const std::string& event);
  // Fails the job once its ranks' failure reports (store_->Failures) name a
  // cause (`final`: the grace period is over, decide now).
  absl::Status JudgeJobFailures(const std::string& job, const std::vector<proto::IterationReport>& failures,
                                int world, bool final);
  // Summarises `iteration` of `job` (every rank reported it) into the history.
  void RecordHistory(const proto::JobStatus& job, int64_t iteration);
  void LivenessLoop();
  void CheckLiveness();
  // Every job, in submission order (jobs that cannot be read are skipped).
  absl::StatusOr<std::vector<proto::JobStatus>> JobsInOrder();
  int64_t NowMs() const { return absl::ToUnixMillis(options_.clock->Now()); }

  store::PlanStore* store_;
  ServiceOptions options_;
  http::Metrics metrics_;

  JobRuntimes runtimes_;
  StatusView status_;
  PlanWaiters waiters_;
  PlanningScheduler scheduler_;

  // Liveness thread only: when the store last had trouble or this process
  // was stalled (an executor's heartbeat may have failed or gone unrecorded
  // because of it, not of the executor), and each running job's progress as
  // last seen.
  absl::Time store_trouble_at_ = absl::InfinitePast();
  struct Progress {
    int64_t done = -1;
    absl::Time since;
  };
  std::map<std::string, Progress> progress_;
  // Fails running jobs whose progress stalled past progress_timeout.
  void CheckProgress(const std::string& job, const proto::JobStatus& status);
  // Reads the store's id; a different one than last time means the store lost
  // its data (Redis restarted empty or flushed): said loudly and counted.
  void CheckStoreIdentity();
  Mutex store_id_mu_;
  std::string store_id_ ABSL_GUARDED_BY(store_id_mu_);
  int64_t store_losses_ ABSL_GUARDED_BY(store_id_mu_) = 0;

  absl::Time started_;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
  Mutex threads_mu_;
  int threads_running_ ABSL_GUARDED_BY(threads_mu_) = 0;  // of threads_, not yet returned

  LastKnown last_known_;
  ExecutorRegistry registry_;
  // Declared last: destroyed first (queued calls run, then the workers join;
  // pending deadlines fire) while everything they use still exists.
  TimerThread timers_;
  ThreadPool store_pool_;
};

}  // namespace dynapipe::planner::service
