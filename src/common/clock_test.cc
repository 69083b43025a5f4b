#include "src/common/clock.h"

#include <catch2/catch.hpp>
#include <thread>

namespace dynapipe {
namespace {

TEST_CASE("FakeClock moves only when advanced") {
  FakeClock clock;
  const absl::Time t0 = clock.Now();
  CHECK(clock.Now() == t0);
  clock.Advance(absl::Seconds(3));
  CHECK(clock.Now() - t0 == absl::Seconds(3));
  clock.SleepFor(absl::Milliseconds(250));
  CHECK(clock.Now() - t0 == absl::Milliseconds(3250));
}

TEST_CASE("Real clock AwaitWithDeadline times out, and wakes when signalled") {
  Clock* clock = Clock::Real();
  Mutex mu;
  bool flag = false;
  {
    MutexLock lock(&mu);
    const absl::Time start = clock->Now();
    CHECK_FALSE(clock->AwaitWithDeadline(&mu, [&flag] { return flag; }, start + absl::Milliseconds(30)));
    CHECK(clock->Now() - start >= absl::Milliseconds(29));
  }
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(10));
    MutexLock lock(&mu);
    flag = true;
  });
  {
    MutexLock lock(&mu);
    CHECK(clock->AwaitWithDeadline(&mu, [&flag] { return flag; }, clock->Now() + absl::Seconds(10)));
  }
  setter.join();
}

}  // namespace
}  // namespace dynapipe
