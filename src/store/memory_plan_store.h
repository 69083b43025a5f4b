#pragma once

// PlanStore in process memory, for unit tests of the services. Same
// semantics as RedisPlanStore, including TTL-free leases that can be dropped
// with ExpireLeases() to simulate a dead planner.

#include <map>
#include <set>

#include "src/common/mutex.h"
#include "src/store/plan_store.h"

namespace dynapipe::store {

class MemoryPlanStore : public PlanStore {
 public:
  absl::StatusOr<std::string> StoreId() override { return store_id_; }
  absl::StatusOr<std::string> CreateJob(const proto::JobSpec& spec, int64_t start_iteration, int64_t now_ms) override;
  absl::StatusOr<proto::JobStatus> GetJob(const std::string& job) override;
  absl::StatusOr<std::vector<std::string>> ListJobs() override;
  absl::StatusOr<bool> SetJobState(const std::string& job, proto::JobState::Value state, const std::string& error,
                                   int64_t now_ms) override;
  absl::StatusOr<bool> TryLease(const std::string& job, int64_t iteration, const std::string& owner,
                                absl::Duration ttl) override;
  absl::Status ReleaseLease(const std::string& job, int64_t iteration, const std::string& owner) override;
  absl::StatusOr<bool> CommitPlans(const std::string& job, int64_t iteration, const std::string& owner,
                                   std::span<const proto::ExecutionPlan> plans, absl::Duration ttl) override;
  absl::StatusOr<bool> IsPlanned(const std::string& job, int64_t iteration) override;
  absl::StatusOr<proto::ExecutionPlan> GetPlan(const std::string& job, int64_t iteration, int rank) override;
  absl::Status PutReport(const proto::IterationReport& report, absl::Duration ttl) override;
  absl::StatusOr<std::vector<int64_t>> DoneByRank(const std::string& job, int world) override;
  absl::StatusOr<proto::IterationReport> GetReport(const std::string& job, int64_t iteration, int rank) override;
  absl::Status PutHistory(const std::string& job, const proto::IterationSummary& summary) override;
  absl::StatusOr<std::vector<proto::IterationSummary>> History(const std::string& job, int64_t from,
                                                               int limit) override;
  absl::Status AddFailure(const proto::IterationReport& report, absl::Duration ttl) override;
  absl::StatusOr<std::vector<proto::IterationReport>> Failures(const std::string& job) override;
  absl::StatusOr<bool> MarkCheckpointShard(const std::string& job, const std::string& checkpoint_dir, int64_t iteration,
                                           int rank, int world) override;
  absl::StatusOr<int64_t> LatestCheckpoint(const std::string& checkpoint_dir) override;
  absl::StatusOr<bool> ClaimGang(const std::string& job, const std::vector<std::string>& executors) override;
  absl::StatusOr<Seat> SeatOf(const std::string& executor) override;
  absl::Status ReleaseSeat(const std::string& executor, const std::string& job) override;
  absl::StatusOr<std::string> RankHolder(const std::string& job, int rank) override;
  absl::Status PutExecutor(const proto::ExecutorRecord& record) override;
  absl::StatusOr<proto::ExecutorRecord> GetExecutor(const std::string& id) override;
  absl::StatusOr<std::vector<std::string>> ListExecutors() override;
  absl::Status DeleteExecutor(const std::string& id) override;
  absl::Status SetBootstrap(const std::string& job, const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> GetBootstrap(const std::string& job, const std::string& key) override;
  void SetListener(std::function<void(const std::string& event)> listener) override;
  bool healthy() const override { return true; }
  int64_t errors() const override { return 0; }

  // How many times plans for the iteration were committed (1 = exactly once;
  // what the store keeps for that check, not part of PlanStore).
  absl::StatusOr<int64_t> PlanWrites(const std::string& job, int64_t iteration);

 private:
  // Tests of corruption handling overwrite a stored plan's bytes.
  friend class MemoryPlanStoreTestPeer;

  void Notify(const std::string& event);

  struct Job {
    proto::JobSpec spec;
    proto::JobState::Value state = proto::JobState::pending;
    std::string error;
    int64_t submit_ms = 0, update_ms = 0;
    int64_t start_iteration = 0;
    int64_t planned = -1;
    std::map<int64_t, int64_t> writes;
    std::map<int, int64_t> done;
    std::map<int64_t, std::string> leases;
    std::set<int64_t> planned_set;
    std::map<std::pair<int64_t, int>, std::string> plans, reports;
    std::map<int, std::string> ranks;
    std::map<std::string, std::string> bootstrap;
    std::map<int64_t, std::set<int>> checkpoint_ranks;  // iteration -> ranks whose shard is written
    std::vector<proto::IterationReport> failures;
    std::map<int64_t, proto::IterationSummary> history;
  };
  Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  const std::string store_id_ = NewStoreId();
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, proto::ExecutorRecord> executors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Seat> seats_ ABSL_GUARDED_BY(mu_);  // by executor id
  std::map<std::string, int64_t> latest_checkpoint_ ABSL_GUARDED_BY(mu_);  // by checkpoint dir
  Mutex listener_mu_;
  std::function<void(const std::string&)> listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace dynapipe::store
