#include "runtime/executor/plan_prefetcher.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <mutex>

#include "absl/time/clock.h"

namespace dynapipe::runtime::executor {
namespace {

// A planner whose plans become ready after a number of timed-out attempts.
struct FakePlanner {
  std::mutex mu;
  std::map<int64_t, int> attempts;
  std::map<int64_t, int> not_ready;  // attempts answered DEADLINE_EXCEEDED first
  int64_t wrong_iteration = -1;      // answered with another iteration's plan
  int64_t wrong_job = -1;            // ... with another job's
  int64_t wrong_rank = -1;           // ... with another rank's
  absl::StatusOr<proto::ExecutionPlan> Fetch(int64_t i) {
    std::lock_guard<std::mutex> l(mu);
    if (attempts[i]++ < not_ready[i]) return absl::DeadlineExceededError("not planned yet");
    proto::ExecutionPlan p;
    p.set_job_id(i == wrong_job ? "job-000002" : "job-000001");
    p.set_rank(i == wrong_rank ? 4 : 3);
    p.set_iteration(i == wrong_iteration ? i + 100 : i);
    return p;
  }
};

TEST_CASE("plans come in order, fetched ahead, and a plan not ready yet is asked for again", "[executor]") {
  FakePlanner planner;
  planner.not_ready[1] = 3;
  PlanPrefetcher plans("job-000001", 3, [&](int64_t i) { return planner.Fetch(i); }, 5, 2, [] { return false; });
  auto p0 = plans.Next(0);
  REQUIRE(p0.ok());
  CHECK(p0->iteration() == 0);
  auto p1 = plans.Next(1);
  REQUIRE(p1.ok());
  CHECK(p1->iteration() == 1);
  CHECK(planner.attempts[1] == 4);
  for (int64_t i = 2; i < 5; ++i) REQUIRE(plans.Next(i).ok());
  // Never past the job's end, and each iteration fetched once when ready.
  CHECK(planner.attempts.count(5) == 0);
  CHECK(planner.attempts[3] == 1);
  CHECK(plans.Next(5).status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("a planner outage shorter than the grace is ridden through; a longer one ends the wait, saying so",
          "[executor]") {
  // Unreachable (UNAVAILABLE, or CANCELLED by a planner shutting down) until `back`.
  std::atomic<int> calls{0};
  const absl::Time back = absl::Now() + absl::Milliseconds(800);
  auto restarting = [&](int64_t i) -> absl::StatusOr<proto::ExecutionPlan> {
    if (absl::Now() < back) {
      return ++calls % 2 == 0 ? absl::UnavailableError("connection refused") : absl::CancelledError("shutting down");
    }
    proto::ExecutionPlan p;
    p.set_job_id("job-000001");
    p.set_rank(3);
    p.set_iteration(i);
    return p;
  };
  PlanPrefetcher rides("job-000001", 3, restarting, 3, 0, [] { return false; }, absl::Seconds(5));
  auto p0 = rides.Next(0);
  REQUIRE(p0.ok());
  CHECK(calls > 1);
  PlanPrefetcher gives_up(
      "job-000001", 3, [](int64_t) -> absl::StatusOr<proto::ExecutionPlan> { return absl::UnavailableError("refused"); },
      3, 0, [] { return false; }, absl::Milliseconds(500));
  const absl::Time t0 = absl::Now();
  auto lost = gives_up.Next(0);
  CHECK(lost.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(lost.status().message()).find("the planner was unreachable for") != std::string::npos);
  CHECK(absl::Now() - t0 < absl::Seconds(3));
}

TEST_CASE("a stopped job ends the wait for its plan; a plan of another job, rank or iteration is refused",
          "[executor]") {
  FakePlanner planner;
  planner.not_ready[0] = 1000000;
  std::atomic<bool> stopped{false};
  PlanPrefetcher plans(
      "job-000001", 3,
      [&](int64_t i) {
        stopped = planner.attempts[0] >= 3;
        return planner.Fetch(i);
      },
      3, 0, [&] { return stopped.load(); });
  CHECK(plans.Next(0).status().code() == absl::StatusCode::kAborted);

  FakePlanner wrong;
  wrong.wrong_iteration = 1;
  PlanPrefetcher other("job-000001", 3, [&](int64_t i) { return wrong.Fetch(i); }, 3, 1, [] { return false; });
  REQUIRE(other.Next(0).ok());
  auto p = other.Next(1);
  CHECK(p.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(p.status().message().find("iteration 101") != std::string::npos);

  // A stale plan of another job, or one meant for another rank, is never run.
  FakePlanner stale;
  stale.wrong_job = 0;
  stale.wrong_rank = 1;
  PlanPrefetcher checked("job-000001", 3, [&](int64_t i) { return stale.Fetch(i); }, 3, 0, [] { return false; });
  auto p0 = checked.Next(0);
  CHECK(p0.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(p0.status().message().find("got job job-000002") != std::string::npos);
  auto p1 = checked.Next(1);
  CHECK(p1.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(p1.status().message().find("rank 4") != std::string::npos);
  CHECK(checked.Next(2).ok());
}

}  // namespace
}  // namespace dynapipe::runtime::executor
