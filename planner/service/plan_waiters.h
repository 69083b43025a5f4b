#pragma once

// The plan server's waits: calls that wait for something the store does not
// hold yet (a plan, a bootstrap key, a job's next change) register here with
// a check and a deadline. The store's events wake the waits keyed by them;
// every wait is re-checked every `recheck` even without one, and a wait past
// its deadline expires (DEADLINE_EXCEEDED). Own lock; one thread runs Run().

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/common/mutex.h"

namespace dynapipe::planner::service {

struct PlanWait {
  // The event that may satisfy it: "plan J I", "bootstrap J K" or "job J".
  std::string key;
  absl::Time deadline;
  // Returns true once it has answered the call.
  std::function<bool()> check;
  // Answers the call with DEADLINE_EXCEEDED, or UNAVAILABLE at shutdown.
  std::function<void(absl::Status)> expire;
};

class PlanWaiters {
 public:
  PlanWaiters(Clock* clock, absl::Duration recheck) : clock_(clock), recheck_(recheck) {}
  PlanWaiters(const PlanWaiters&) = delete;
  PlanWaiters& operator=(const PlanWaiters&) = delete;

  // Registers `w`, checked once right away (its event may have fired between
  // the caller's own check and now). After Stop it expires at once.
  void Add(PlanWait w);
  // A store event ("plan J I", "bootstrap J K", ...): wakes the waits keyed by
  // it and by its job ("job J"). "reconnected" re-checks every wait.
  void Notify(const std::string& event);
  // Checks and expires waits until Stop.
  void Run();
  // Makes Run return and Add refuse; the waits still registered stay until
  // ExpireAll answers them (after Run's thread has joined).
  void Stop();
  void ExpireAll();

  size_t size() const;

 private:
  // The waits to check now: those whose event fired, or all of them on a
  // sweep. Empty and false once stopping.
  bool NextBatch(absl::Time* next_sweep, std::vector<std::shared_ptr<PlanWait>>* check);
  void Remove(const std::vector<std::shared_ptr<PlanWait>>& finished);

  Clock* const clock_;
  const absl::Duration recheck_;
  mutable Mutex mu_;
  std::multimap<std::string, std::shared_ptr<PlanWait>> waits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> fired_ ABSL_GUARDED_BY(mu_);  // events not yet processed
  bool wake_all_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dynapipe::planner::service
