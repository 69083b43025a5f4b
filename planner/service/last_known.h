#pragma once

// The planner's last known state of the jobs and executors, kept from every
// successful read of the plan store. Status calls answer from it, marked
// stale with its age, while the store (Redis) is stalled or unreachable. When
// the store loses its data (restarted empty), the jobs known until then are
// remembered as lost, so a user asking about one is told what happened and
// how to resume it.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/services.pb.h"
#include "src/common/mutex.h"

namespace dynapipe::planner::service {

class LastKnown {
 public:
  // Jobs remembered as lost (the newest; older ones are forgotten).
  static constexpr size_t kMaxLost = 10000;

  // A job's status as read from the store at `at`.
  void PutJob(const proto::JobStatus& status, absl::Time at);
  // Every job the store holds, read at `at`. Jobs not listed stay (the store
  // never drops one but with all its data, which StoreLost handles).
  void PutJobs(const std::vector<proto::JobStatus>& jobs, absl::Time at);
  void PutExecutors(const std::vector<proto::ExecutorRecord>& executors, absl::Time at);

  struct Job {
    proto::JobStatus status;
    absl::Time at = absl::InfinitePast();
  };
  std::optional<Job> GetJob(const std::string& id) const;
  // In submission order (job ids sort so); `at`: when the list was last read
  // whole (InfinitePast: never).
  struct Jobs {
    std::vector<proto::JobStatus> jobs;
    absl::Time at = absl::InfinitePast();
  };
  Jobs AllJobs() const;
  struct Executors {
    std::vector<proto::ExecutorRecord> executors;
    absl::Time at = absl::InfinitePast();
  };
  Executors AllExecutors() const;

  // The store lost its data at `at` (its id went from `old_id` to `new_id`):
  // every job known until now is lost with it.
  void StoreLost(absl::Time at, const std::string& old_id, const std::string& new_id);
  struct LostJob {
    proto::JobStatus last;  // its last known status
    absl::Time at;          // when the loss was found
    std::string old_store, new_store;
  };
  std::optional<LostJob> GetLost(const std::string& id) const;
  // Lost jobs that had not ended, and the latest loss (at InfinitePast: none).
  struct LossSummary {
    int64_t unfinished = 0;
    absl::Time at = absl::InfinitePast();
  };
  LossSummary Losses() const;

 private:
  mutable Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  absl::Time jobs_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Executors executors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, LostJob> lost_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> lost_order_ ABSL_GUARDED_BY(mu_);  // oldest first, for kMaxLost
  LossSummary losses_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynapipe::planner::service
