#include "src/common/clock.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <thread>

namespace dynapipe {
namespace {

TEST_CASE("ProcessCpuSeconds counts the CPU time this process spends, in seconds") {
  const double before = ProcessCpuSeconds();
  CHECK(before >= 0);
  // Spin until the wall clock has moved 200 ms: at least ~0.1 s of CPU even
  // on a loaded machine, far from an hour.
  const auto start = std::chrono::steady_clock::now();
  volatile uint64_t x = 1;
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(200)) x = x * 6364136223846793005ULL + 1;
  const double spent = ProcessCpuSeconds() - before;
  CHECK(spent > 0.05);
  CHECK(spent < 60);
}

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
