#pragma once

// The Redis key layout, in one place. Every key starts with a configurable
// prefix (default "dynapipe:"). J = job id, I = iteration, R = rank.
//
//   {p}store:id                this store's identity: random hex made the first time it is asked for;
//                              part of every job id ("job-ID-NNNNNN"), so a store restarted empty
//                              (new id) never hands out an old job's id, and planners notice the loss
//   {p}jobs:next               INCR counter for job ids
//   {p}jobs                    SET of job ids
//   {p}job:J:spec              JobSpec (binary proto)
//   {p}job:J:state             HASH: state (JobState number), error, submit_ms, update_ms,
//                              start_iteration (first iteration; > 0 when resumed from a checkpoint)
//   {p}job:J:lease:I           planner id holding the right to plan iteration I (PX ttl)
//   {p}job:J:planned:I         "1" once every rank's plan for I is stored (no TTL: exactly once)
//   {p}job:J:plan:I:R          ExecutionPlan (binary proto with checksum; PX ttl)
//   {p}job:J:progress          HASH: "planned" = highest iteration stored,
//                              "writes:I" = times plans for I were committed (1 = exactly once),
//                              "done:R" = last iteration rank R completed (start_iteration - 1
//                              for every rank when the job is created)
//   {p}job:J:rank:R            executor id holding rank R (every rank set at once: ClaimGang)
//   {p}job:J:metrics:I:R       IterationReport (binary proto; PX ttl)
//   {p}job:J:failures          LIST of IterationReports with `error`, in arrival order (PX ttl)
//   {p}job:J:bootstrap:K       bytes published for the job's communicator
//   {p}job:J:checkpoint:I      SET of ranks whose checkpoint shard of iteration I is written (no TTL)
//   {p}checkpoint:latest:D     latest iteration whose shards are complete in checkpoint dir D (only
//                              raised; outlives jobs: a resubmitted job resumes from it)
//   {p}executors               SET of executor ids
//   {p}executors:ID:seat       "J R": the rank the executor was given (ClaimGang), until released
//   {p}executors:ID            ExecutorRecord (binary proto; holds the SHA-256 of the executor's
//                              secret, never the secret: src/rpc/executor_credential.h)
//   {p}events                  pub/sub channel: "plan J I", "bootstrap J K", "job J"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace dynapipe::store {

class Keys {
 public:
  explicit Keys(std::string prefix = "dynapipe:") : p_(std::move(prefix)) {}
  const std::string& prefix() const { return p_; }

  std::string StoreId() const { return p_ + "store:id"; }
  std::string JobCounter() const { return p_ + "jobs:next"; }
  std::string Jobs() const { return p_ + "jobs"; }
  std::string Spec(const std::string& j) const { return absl::StrCat(p_, "job:", j, ":spec"); }
  std::string State(const std::string& j) const { return absl::StrCat(p_, "job:", j, ":state"); }
  std::string Lease(const std::string& j, int64_t i) const { return absl::StrCat(p_, "job:", j, ":lease:", i); }
  std::string Planned(const std::string& j, int64_t i) const { return absl::StrCat(p_, "job:", j, ":planned:", i); }
  std::string Plan(const std::string& j, int64_t i, int r) const { return absl::StrCat(p_, "job:", j, ":plan:", i, ":", r); }
  std::string Progress(const std::string& j) const { return absl::StrCat(p_, "job:", j, ":progress"); }
  std::string Rank(const std::string& j, int r) const { return absl::StrCat(p_, "job:", j, ":rank:", r); }
  std::string Metrics(const std::string& j, int64_t i, int r) const { return absl::StrCat(p_, "job:", j, ":metrics:", i, ":", r); }
  std::string Failures(const std::string& j) const { return absl::StrCat(p_, "job:", j, ":failures"); }
  std::string History(const std::string& j) const { return absl::StrCat(p_, "job:", j, ":history"); }
  std::string Bootstrap(const std::string& j, const std::string& k) const { return absl::StrCat(p_, "job:", j, ":bootstrap:", k); }
  std::string CheckpointRanks(const std::string& j, int64_t i) const { return absl::StrCat(p_, "job:", j, ":checkpoint:", i); }
  std::string LatestCheckpoint(const std::string& dir) const { return absl::StrCat(p_, "checkpoint:latest:", dir); }
  std::string Executors() const { return p_ + "executors"; }
  std::string Executor(const std::string& id) const { return absl::StrCat(p_, "executors:", id); }
  std::string Seat(const std::string& id) const { return absl::StrCat(p_, "executors:", id, ":seat"); }
  std::string Events() const { return p_ + "events"; }

 private:
  std::string p_;
};

}  // namespace dynapipe::store
