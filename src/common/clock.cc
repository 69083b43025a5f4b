#include "src/common/clock.h"

#include <sys/resource.h>

namespace dynapipe {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
  bool AwaitWithDeadline(Mutex* mu, const std::function<bool()>& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu->AwaitWithDeadline(cond, deadline);
  }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

absl::Time FakeClock::Now() {
  MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration d) { Advance(d); }

bool FakeClock::AwaitWithDeadline(Mutex*, const std::function<bool()>& cond, absl::Time) {
  return cond();
}

void FakeClock::Advance(absl::Duration d) {
  MutexLock lock(&mu_);
  now_ += d;
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

}  // namespace dynapipe
