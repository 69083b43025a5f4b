#include "src/common/answer_within.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <string>

#include "absl/time/clock.h"

namespace dynapipe {
namespace {

using Result = absl::StatusOr<std::string>;

struct Fixture {
  ThreadPool pool{2};
  TimerThread timers;
  AnswerWithinOptions Options(size_t max_queued = 16) {
    AnswerWithinOptions o;
    o.pool = &pool;
    o.timers = &timers;
    o.budget = absl::Milliseconds(100);
    o.max_queued = max_queued;
    return o;
  }
};

std::function<Result(const absl::Status&)> Fallback(std::string* why) {
  return [why](const absl::Status& s) -> Result {
    *why = s.ToString();
    return std::string("fallback");
  };
}

TEST_CASE("A primary that answers in time is the answer") {
  Fixture f;
  std::string why;
  const Result r = AnswerWithinSync<std::string>(f.Options(), [] { return Result("primary"); }, Fallback(&why));
  CHECK(*r == "primary");
  CHECK(why.empty());
}

TEST_CASE("A stalled primary is answered for by the fallback within the budget; its late result is dropped") {
  Fixture f;
  std::string why;
  std::atomic<bool> finished{false};
  const absl::Time start = absl::Now();
  const Result r = AnswerWithinSync<std::string>(
      f.Options(),
      [&] {
        absl::SleepFor(absl::Milliseconds(600));
        finished = true;
        return Result("late");
      },
      Fallback(&why));
  const absl::Duration took = absl::Now() - start;
  CHECK(*r == "fallback");
  CHECK(took >= absl::Milliseconds(100));
  CHECK(took < absl::Milliseconds(400));
  CHECK_THAT(why, Catch::Matchers::Contains("DEADLINE_EXCEEDED"));
  CHECK_FALSE(finished);
  while (!finished) absl::SleepFor(absl::Milliseconds(10));  // the primary ran on, to no one
}

TEST_CASE("A primary failing UNAVAILABLE is answered for by the fallback; other errors stand") {
  Fixture f;
  std::string why;
  Result r = AnswerWithinSync<std::string>(
      f.Options(), [] { return Result(absl::UnavailableError("redis down")); }, Fallback(&why));
  CHECK(*r == "fallback");
  CHECK_THAT(why, Catch::Matchers::Contains("redis down"));
  r = AnswerWithinSync<std::string>(f.Options(), [] { return Result(absl::NotFoundError("no job")); }, Fallback(&why));
  CHECK(r.status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("With the pool full the fallback answers at once, RESOURCE_EXHAUSTED as the reason") {
  Fixture f;
  Mutex mu;
  bool open = false;
  auto held = [&] {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return open; });
    return Result("held");
  };
  std::atomic<int> answered{0};
  std::string unused[3];
  // Two workers held, one task queued: the queue (max 1) is full.
  for (int i = 0; i < 3; ++i) {
    AnswerWithin<std::string>(f.Options(1), held, Fallback(&unused[i]), [&](Result) { ++answered; });
  }
  std::string why;
  const absl::Time start = absl::Now();
  const Result r = AnswerWithinSync<std::string>(f.Options(1), held, Fallback(&why));
  CHECK(absl::Now() - start < absl::Milliseconds(50));
  CHECK(*r == "fallback");
  CHECK_THAT(why, Catch::Matchers::Contains("RESOURCE_EXHAUSTED"));
  {
    MutexLock lock(&mu);
    open = true;
  }
  while (answered < 3) absl::SleepFor(absl::Milliseconds(5));
}

}  // namespace
}  // namespace dynapipe
