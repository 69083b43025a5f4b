#include "src/common/mutex.h"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace dynapipe {
namespace {

TEST_CASE("MutexLock serialises increments from many threads") {
  Mutex mu;
  long counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(counter == 80000);
}

TEST_CASE("Await wakes when another thread makes the condition true") {
  Mutex mu;
  int stage = 0;
  std::thread producer([&] {
    for (int i = 1; i <= 3; ++i) {
      absl::SleepFor(absl::Milliseconds(2));
      MutexLock lock(&mu);
      stage = i;
    }
  });
  {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stage == 3; });
    CHECK(stage == 3);
  }
  producer.join();
}

TEST_CASE("AwaitWithDeadline returns false at the deadline") {
  Mutex mu;
  MutexLock lock(&mu);
  const absl::Time start = absl::Now();
  CHECK_FALSE(mu.AwaitWithDeadline([] { return false; }, start + absl::Milliseconds(20)));
  CHECK(absl::Now() - start >= absl::Milliseconds(19));
  CHECK(mu.AwaitWithDeadline([] { return true; }, start));  // already true: no wait
}

}  // namespace
}  // namespace dynapipe
