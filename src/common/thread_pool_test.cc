#include "src/common/thread_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "src/common/mutex.h"

namespace dynapipe {
namespace {

TEST_CASE("ThreadPool runs every scheduled task before destruction") {
  std::atomic<int> sum{0};
  {
    ThreadPool pool(3);
    for (int i = 1; i <= 1000; ++i) pool.Schedule([&sum, i] { sum += i; });
  }
  CHECK(sum.load() == 500500);
}

TEST_CASE("ParallelFor visits each index exactly once") {
  ThreadPool pool(4);
  for (int n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int i) { hits[i]++; });
    for (int i = 0; i < n; ++i) CHECK(hits[i].load() == 1);
  }
}

TEST_CASE("TrySchedule refuses work once max_queued tasks wait; the queued ones still run") {
  std::atomic<int> ran{0};
  Mutex gate_mu;
  bool open = false;
  {
    ThreadPool pool(1);
    // The only worker is held: tasks queue behind it.
    pool.Schedule([&] {
      MutexLock lock(&gate_mu);
      gate_mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return open; });
    });
    while (pool.queued() != 0) std::this_thread::yield();  // the worker took it
    CHECK(pool.TrySchedule([&] { ++ran; }, 2));
    CHECK(pool.TrySchedule([&] { ++ran; }, 2));
    CHECK_FALSE(pool.TrySchedule([&] { ran += 100; }, 2));
    CHECK(pool.queued() == 2);
    MutexLock lock(&gate_mu);
    open = true;
  }
  CHECK(ran == 2);
}

TEST_CASE("A pool of zero threads still has one worker") {
  ThreadPool pool(0);
  CHECK(pool.size() == 1);
  std::atomic<int> ran{0};
  pool.ParallelFor(5, [&](int) { ran++; });
  CHECK(ran.load() == 5);
}

}  // namespace
}  // namespace dynapipe
