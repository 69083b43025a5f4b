#pragma once

// The executors a planner knows: registration (an id and a secret whose hash
// the record keeps), identity checks for executor-only calls, heartbeats that
// hand an idle executor its seat, gang placement of pending jobs on idle
// executors (whole gangs only, gang_placement.h), and giving up on executors
// that stopped sending heartbeats. Records live in the store; own lock: one
// placement pass at a time in this process.

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/service/last_known.h"
#include "proto/services.pb.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"
#include "src/rpc/executor_credential.h"
#include "src/store/plan_store.h"

namespace dynapipe::planner::service {

struct RegistryOptions {
  absl::Duration heartbeat_interval;  // told to executors at registration
  absl::Duration heartbeat_timeout;   // silent this long: lost
  absl::Duration lost_executor_ttl;   // lost this long: forgotten
  Clock* clock = Clock::Real();
};

class ExecutorRegistry {
 public:
  // Every job in submission order, as the job registry reads them.
  using JobsReader = std::function<absl::StatusOr<std::vector<proto::JobStatus>>()>;
  ExecutorRegistry(store::PlanStore* store, LastKnown* last_known, JobsReader read_jobs, RegistryOptions options)
      : store_(store), last_known_(last_known), read_jobs_(std::move(read_jobs)), options_(options) {}

  // Returns the executor's id and secret (src/rpc/executor_credential.h).
  absl::StatusOr<proto::RegisterExecutorResponse> Register(const proto::RegisterExecutorRequest& req);
  // Records the heartbeat; an idle executor gets the rank it holds a seat
  // for (placing pending jobs first if it has none), and one whose job ended
  // is told to stop.
  absl::StatusOr<proto::HeartbeatResponse> Heartbeat(const proto::HeartbeatRequest& req);
  // Every record, without the secrets' hashes (also kept as last known).
  absl::StatusOr<std::vector<proto::ExecutorRecord>> Executors();

  // Executor identity, checked by the gRPC layer before the executor-side
  // calls run (they trust their caller). The caller's record:
  // UNAUTHENTICATED without a credential or with a wrong secret, NOT_FOUND
  // if the id is not registered (the executor then registers again).
  absl::StatusOr<proto::ExecutorRecord> AuthenticateExecutor(const rpc::ExecutorCredential& caller);
  // Heartbeat only for the caller's own id (else PERMISSION_DENIED).
  absl::Status AuthorizeHeartbeat(const rpc::ExecutorCredential& caller, const proto::HeartbeatRequest& req);
  // ReportIteration (progress, failures, checkpoint shards) only from the
  // executor holding the report's job and rank (else PERMISSION_DENIED).
  absl::Status AuthorizeReport(const rpc::ExecutorCredential& caller, const proto::IterationReport& report);
  // Bootstrap Set/Get only by an executor assigned to `job` (else PERMISSION_DENIED).
  absl::Status AuthorizeJobMember(const rpc::ExecutorCredential& caller, const std::string& job);

  // A job was submitted: the next idle executor's heartbeat runs a placement pass.
  void JobSubmitted();
  // Places pending jobs on idle executors, on jobs and records already read
  // (a null `records` is read only if some job waits); a job that must wait
  // gets the reason as its error.
  absl::Status PlaceWaitingJobs(const std::vector<proto::JobStatus>& jobs,
                                const std::vector<proto::ExecutorRecord>* records);
  // Moves a pending job to running once every rank is held; true if it did.
  absl::StatusOr<bool> MaybeStartJob(const std::string& job, int world);
  // Marks executors silent past heartbeat_timeout lost (failing the job they
  // hold a rank of) and forgets those lost past lost_executor_ttl. The caller
  // decides when heartbeats are to be trusted (not during store trouble).
  void MarkLost(std::vector<proto::ExecutorRecord>* records);

 private:
  absl::Status MaybeAssign(proto::ExecutorRecord* rec);
  // A placement pass; `eager`: from a heartbeat, so at most every
  // kEagerScheduleInterval and only while jobs may wait.
  absl::Status ScheduleGangs(bool eager);
  absl::Status PlaceLocked(const std::vector<proto::JobStatus>& jobs,
                           const std::vector<proto::ExecutorRecord>* records) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t NowMs() const { return absl::ToUnixMillis(options_.clock->Now()); }

  store::PlanStore* const store_;
  LastKnown* const last_known_;
  const JobsReader read_jobs_;
  const RegistryOptions options_;

  Mutex mu_;  // one placement pass at a time
  static constexpr absl::Duration kEagerScheduleInterval = absl::Milliseconds(100);
  absl::Time last_eager_schedule_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Whether a pending job may be waiting for executors: set by JobSubmitted
  // and by a pass that left one waiting, cleared by a pass that found none.
  std::atomic<bool> jobs_may_wait_{true};
};

}  // namespace dynapipe::planner::service
