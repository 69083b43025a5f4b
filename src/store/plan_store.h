#pragma once

// Where jobs, execution plans, leases, progress, executors and bootstrap data
// live. RedisPlanStore is the real one (several planner processes share it);
// MemoryPlanStore serves unit tests. Plans are stored with their checksum and
// checked on read: corrupt or truncated bytes are DATA_LOSS, never returned.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proto/plan.pb.h"
#include "proto/report.pb.h"
#include "proto/services.pb.h"
#include "src/spec/job_state.h"

namespace dynapipe::store {

// NOT_FOUND for a job id a caller sent, printed as one safe line: an id that
// is not plain letters, digits, '-' and '_' is quoted with its bytes escaped.
inline absl::Status JobNotFound(absl::string_view job) {
  const bool plain = !job.empty() && job.size() <= 64 && std::all_of(job.begin(), job.end(), [](unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_';
  });
  const std::string shown =
      plain ? std::string(job) : absl::StrCat("\"", absl::CHexEscape(job.substr(0, 64)), job.size() > 64 ? "...\"" : "\"");
  return absl::NotFoundError(absl::StrCat("job ", shown, " not found"));
}

// A rank of a job, held by an executor.
struct Seat {
  std::string job;  // "" = no seat
  int rank = 0;
};

class PlanStore {
 public:
  virtual ~PlanStore() = default;

  // This store's identity, made (random) the first time it is asked for.
  // Every job id contains it. A different answer later means the store lost
  // its data (Redis restarted without its append-only file, or flushed):
  // the jobs before are gone, and their ids are never handed out again.
  virtual absl::StatusOr<std::string> StoreId() = 0;

  // Jobs. CreateJob assigns the id ("job-STOREID-NNNNNN", increasing within
  // one store) and stores the spec with state pending.
  // A job starting at `start_iteration` > 0 (resumed from a checkpoint) shows
  // every rank's last done iteration as start_iteration - 1, so its
  // iterations_done, planning and executors' assignments begin there.
  // INVALID_ARGUMENT if start_iteration is negative.
  virtual absl::StatusOr<std::string> CreateJob(const proto::JobSpec& spec, int64_t start_iteration,
                                                int64_t now_ms) = 0;
  // The job with its spec, state and progress (plans_ready, iterations_done,
  // start_iteration).
  virtual absl::StatusOr<proto::JobStatus> GetJob(const std::string& job) = 0;
  virtual absl::StatusOr<std::vector<std::string>> ListJobs() = 0;
  // Moves the job to `state` (with `error`) unless it is already terminal
  // (succeeded, failed, cancelled); true if the state or error changed. A job
  // never returns to pending: for a job no longer pending, a pending update
  // (a new waiting reason) changes nothing.
  virtual absl::StatusOr<bool> SetJobState(const std::string& job, proto::JobState::Value state,
                                           const std::string& error, int64_t now_ms) = 0;

  // Plans. A planner takes a lease on an iteration before planning it; the
  // commit stores every rank's plan only if the lease is still its own and the
  // iteration is not stored yet (so each iteration is stored exactly once).
  virtual absl::StatusOr<bool> TryLease(const std::string& job, int64_t iteration, const std::string& owner,
                                        absl::Duration ttl) = 0;
  virtual absl::Status ReleaseLease(const std::string& job, int64_t iteration, const std::string& owner) = 0;
  virtual absl::StatusOr<bool> CommitPlans(const std::string& job, int64_t iteration, const std::string& owner,
                                           std::span<const proto::ExecutionPlan> plans, absl::Duration ttl) = 0;
  virtual absl::StatusOr<bool> IsPlanned(const std::string& job, int64_t iteration) = 0;
  // NOT_FOUND if not stored (yet, or expired); DATA_LOSS if corrupt.
  virtual absl::StatusOr<proto::ExecutionPlan> GetPlan(const std::string& job, int64_t iteration, int rank) = 0;

  // Progress: stores the report and raises the rank's last done iteration.
  virtual absl::Status PutReport(const proto::IterationReport& report, absl::Duration ttl) = 0;
  // Last completed iteration per rank (-1: none), for ranks 0..world-1.
  virtual absl::StatusOr<std::vector<int64_t>> DoneByRank(const std::string& job, int world) = 0;
  virtual absl::StatusOr<proto::IterationReport> GetReport(const std::string& job, int64_t iteration, int rank) = 0;
  // The job's history: one summary per completed iteration, without a TTL,
  // the newest kHistoryLimit per job kept (a summary is ~70 bytes, ~170 in Redis). Writing
  // an iteration again replaces it.
  static constexpr int kHistoryLimit = 100000;
  virtual absl::Status PutHistory(const std::string& job, const proto::IterationSummary& summary) = 0;
  // Summaries of iterations >= `from`, ascending, at most `limit`.
  virtual absl::StatusOr<std::vector<proto::IterationSummary>> History(const std::string& job, int64_t from,
                                                                       int limit) = 0;
  // Failures executors reported (reports with `error`), kept per job in
  // arrival order: the planner judges from all of them which rank caused the
  // failure (planner/service/failures.h).
  virtual absl::Status AddFailure(const proto::IterationReport& report, absl::Duration ttl) = 0;
  virtual absl::StatusOr<std::vector<proto::IterationReport>> Failures(const std::string& job) = 0;

  // Checkpoints. Adds `rank` to the ranks whose shard of `iteration` is
  // written; the call that completes the set (all `world` ranks) raises the
  // latest complete checkpoint of `checkpoint_dir` to `iteration` (never
  // lowers it) and returns true. Repeated marks of a rank count once.
  virtual absl::StatusOr<bool> MarkCheckpointShard(const std::string& job, const std::string& checkpoint_dir,
                                                   int64_t iteration, int rank, int world) = 0;
  // The latest complete checkpoint recorded for `checkpoint_dir`; -1 if none.
  virtual absl::StatusOr<int64_t> LatestCheckpoint(const std::string& checkpoint_dir) = 0;

  // Ranks and executors. A job's ranks are taken as a gang: ClaimGang gives
  // rank r of `job` to executors[r] for every rank at once, and only if none
  // of those ranks is held and none of the executors holds a seat (a rank of
  // a job not yet released); otherwise nothing changes and it returns false.
  // Atomic across planners sharing the store.
  virtual absl::StatusOr<bool> ClaimGang(const std::string& job, const std::vector<std::string>& executors) = 0;
  virtual absl::StatusOr<std::string> RankHolder(const std::string& job, int rank) = 0;  // "" if free
  // The seat `executor` holds; an empty job if none.
  virtual absl::StatusOr<Seat> SeatOf(const std::string& executor) = 0;
  // Frees `executor`'s seat if it is in `job` (a no-op otherwise): the
  // executor may be given to another job. The job's rank keeps its holder.
  virtual absl::Status ReleaseSeat(const std::string& executor, const std::string& job) = 0;
  virtual absl::Status PutExecutor(const proto::ExecutorRecord& record) = 0;
  virtual absl::StatusOr<proto::ExecutorRecord> GetExecutor(const std::string& id) = 0;
  virtual absl::StatusOr<std::vector<std::string>> ListExecutors() = 0;
  // Forgets an executor and its seat (OK if it is unknown); its job's rank
  // keeps its holder.
  virtual absl::Status DeleteExecutor(const std::string& id) = 0;

  // Bootstrap key-value data per job.
  virtual absl::Status SetBootstrap(const std::string& job, const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> GetBootstrap(const std::string& job, const std::string& key) = 0;

  // Calls `listener` with "plan J I" / "bootstrap J K" / "job J" when another
  // process (or this one) changes those; best effort: waiters re-check on a
  // timer as well.
  virtual void SetListener(std::function<void(const std::string& event)> listener) = 0;

  // Store reachable (for health checks).
  virtual bool healthy() const = 0;
  // When the store was last unreachable or stalled (a command that failed to
  // reach it or took far longer than usual); InfinitePast if never. Writes
  // such as heartbeats may have been held up then, so the planner does not
  // judge executors by them until a heartbeat timeout has passed since.
  virtual absl::Time last_trouble() const { return absl::InfinitePast(); }
  virtual int64_t errors() const = 0;

  // Thread-safe and final, for a daemon's exit: calls waiting on the store
  // (a stalled or lost connection) fail at once, UNAVAILABLE, and so does
  // every later call. In-memory stores never wait.
  virtual void Shutdown() {}
};

// A fresh random store identity: 8 hex digits.
std::string NewStoreId();

// Ranks a job needs: pp x dp, each at least 1.
inline int WorldSize(const proto::JobSpec& spec) {
  return std::max(1, spec.parallelism().pp()) * std::max(1, spec.parallelism().dp());
}

// Succeeded, failed and cancelled jobs never change state again.
using spec::IsTerminal;

// INVALID_ARGUMENT unless the arguments of MarkCheckpointShard make sense.
inline absl::Status CheckShardMark(const std::string& checkpoint_dir, int64_t iteration, int rank, int world) {
  if (checkpoint_dir.empty()) return absl::InvalidArgumentError("checkpoint_dir: must be set");
  if (iteration < 0) return absl::InvalidArgumentError(absl::StrCat("iteration: ", iteration, " is negative"));
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " is not a rank of a world of ", world));
  }
  return absl::OkStatus();
}

// Parses stored plan bytes; DATA_LOSS unless they parse and the checksum matches.
absl::StatusOr<proto::ExecutionPlan> DecodePlan(const std::string& bytes, const std::string& what);

// DecodePlan for the plan stored as `job`'s, `iteration`'s and `rank`'s: also
// DATA_LOSS when the (intact, sealed) plan names another job, iteration or
// rank, i.e. was copied there from another key.
absl::StatusOr<proto::ExecutionPlan> DecodePlanFor(const std::string& bytes, const std::string& job,
                                                   int64_t iteration, int rank);

}  // namespace dynapipe::store
