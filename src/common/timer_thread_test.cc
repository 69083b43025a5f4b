#include "src/common/timer_thread.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <vector>

#include "absl/time/clock.h"
#include "src/common/mutex.h"

namespace dynapipe {
namespace {

TEST_CASE("Callbacks run in order of their due times, not before them") {
  Mutex mu;
  std::vector<int> order;
  std::vector<absl::Duration> late;
  const absl::Time start = absl::Now();
  {
    TimerThread timers;
    for (int ms : {120, 40, 80, 0}) {
      timers.After(absl::Milliseconds(ms), [&, ms] {
        MutexLock lock(&mu);
        order.push_back(ms);
        late.push_back(absl::Now() - start - absl::Milliseconds(ms));
      });
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  CHECK(order == std::vector<int>{0, 40, 80, 120});
  for (absl::Duration d : late) CHECK(d >= absl::ZeroDuration());
}

TEST_CASE("A timer destroyed early runs what is pending at once") {
  std::atomic<int> ran{0};
  const absl::Time start = absl::Now();
  {
    TimerThread timers;
    timers.After(absl::Hours(1), [&] { ++ran; });
    timers.After(absl::Hours(2), [&] { ++ran; });
  }
  CHECK(ran == 2);
  CHECK(absl::Now() - start < absl::Seconds(5));
}

}  // namespace
}  // namespace dynapipe
