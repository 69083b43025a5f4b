#pragma once

// PlanStore over Redis (key layout in keys.h). Multi-key updates that must be
// atomic (plan commit, state change, progress) run as Lua scripts. A
// subscriber thread on its own connection listens on the events channel and
// reconnects after Redis comes back.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "src/store/keys.h"
#include "src/store/plan_store.h"
#include "src/store/redis_client.h"

namespace dynapipe::store {

class RedisPlanStore : public PlanStore {
 public:
  RedisPlanStore(RedisOptions options, std::string prefix = "dynapipe:");
  ~RedisPlanStore() override;

  absl::StatusOr<std::string> StoreId() override;
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
  bool healthy() const override { return client_.healthy(); }
  absl::Time last_trouble() const override { return client_.last_trouble(); }
  int64_t errors() const override { return client_.errors(); }
  void Shutdown() override;

  // How many times plans for the iteration were committed (1 = exactly once;
  // what the commit script counts for that check, not part of PlanStore).
  absl::StatusOr<int64_t> PlanWrites(const std::string& job, int64_t iteration);

  RedisClient& client() { return client_; }
  const Keys& keys() const { return keys_; }

 private:
  void SubscriberLoop();

  RedisOptions options_;
  Keys keys_;
  RedisClient client_;
  Mutex listener_mu_;
  std::function<void(const std::string&)> listener_ ABSL_GUARDED_BY(listener_mu_);
  std::atomic<bool> stop_{false};
  SocketInterrupter subscriber_socket_;  // the subscriber's connection, woken by Shutdown
  std::thread subscriber_;
};

}  // namespace dynapipe::store
