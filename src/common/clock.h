#pragma once

// Time source behind an interface so deadlines, leases and heartbeats are
// testable with a fake clock.

#include "absl/base/thread_annotations.h"
#include <functional>

#include "src/common/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dynapipe {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  virtual void SleepFor(absl::Duration d) = 0;
  // Waits until `cond` holds (mu held) or `deadline` passes; true if it holds.
  virtual bool AwaitWithDeadline(Mutex* mu, const std::function<bool()>& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // The process-wide wall clock (never deleted).
  static Clock* Real();
};

// A clock that moves only when told to. SleepFor advances it.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 50)) : now_(start) {}
  absl::Time Now() override;
  void SleepFor(absl::Duration d) override;
  // Returns at once: the fake time only moves by Advance/SleepFor, so waiting
  // for a condition that is false now would wait forever.
  bool AwaitWithDeadline(Mutex* mu, const std::function<bool()>& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Advance(absl::Duration d);

 private:
  Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

// User + system CPU seconds this process has used so far, every thread
// included (what a benchmark's ranks and their library threads cost where
// they share cores).
double ProcessCpuSeconds();

}  // namespace dynapipe
