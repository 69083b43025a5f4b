#include "planner/service/plan_waiters.h"
#include "src/testing/eventually.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

namespace dynapipe::planner::service {
namespace {

using ::dynapipe::testing::Eventually;

// Runs the waiters on their own thread for the test's lifetime.
struct Running {
  explicit Running(absl::Duration recheck) : waiters(Clock::Real(), recheck), thread([this] { waiters.Run(); }) {}
  ~Running() {
    waiters.Stop();
    thread.join();
    waiters.ExpireAll();
  }
  PlanWaiters waiters;
  std::thread thread;
};

struct Outcome {
  std::atomic<bool> ready{false};  // what check() sees
  std::atomic<int> checks{0};
  std::atomic<int> answered{0};
  std::atomic<int> expired{0};
  std::atomic<int> code{-1};
};

PlanWait WaitFor(const std::string& key, absl::Time deadline, Outcome* o) {
  PlanWait w;
  w.key = key;
  w.deadline = deadline;
  w.check = [o] {
    ++o->checks;
    if (!o->ready) return false;
    ++o->answered;
    return true;
  };
  w.expire = [o](absl::Status why) {
    o->code = static_cast<int>(why.code());
    ++o->expired;
  };
  return w;
}

TEST_CASE("A wait is answered by its event, once, and then forgotten", "[waiters]") {
  Running r(absl::Hours(1));  // no sweeps: only events wake it
  Outcome o;
  r.waiters.Add(WaitFor("plan j1 4", absl::InfiniteFuture(), &o));
  REQUIRE(Eventually([&] { return o.checks == 1; }));  // once right away, on registering
  o.ready = true;
  r.waiters.Notify("plan j1 5");  // another iteration: not this wait
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(o.answered == 0);
  r.waiters.Notify("plan j1 4");
  REQUIRE(Eventually([&] { return o.answered == 1; }));
  REQUIRE(Eventually([&] { return r.waiters.size() == 0; }));
  r.waiters.Notify("plan j1 4");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(o.answered == 1);
  CHECK(o.expired == 0);
}

TEST_CASE("A job's events wake the waits on the job; reconnecting wakes every wait", "[waiters]") {
  Running r(absl::Hours(1));
  Outcome job, boot;
  r.waiters.Add(WaitFor("job j2", absl::InfiniteFuture(), &job));
  r.waiters.Add(WaitFor("bootstrap j3 nccl", absl::InfiniteFuture(), &boot));
  REQUIRE(Eventually([&] { return job.checks == 1 && boot.checks == 1; }));
  job.ready = true;
  boot.ready = true;
  r.waiters.Notify("plan j2 0");
  REQUIRE(Eventually([&] { return job.answered == 1; }));
  CHECK(boot.answered == 0);
  r.waiters.Notify("reconnected");
  REQUIRE(Eventually([&] { return boot.answered == 1; }));
}

TEST_CASE("A wait past its deadline expires at the next sweep, without any event", "[waiters]") {
  Running r(absl::Milliseconds(20));
  Outcome o;
  r.waiters.Add(WaitFor("plan j4 0", absl::Now() + absl::Milliseconds(60), &o));
  REQUIRE(Eventually([&] { return o.expired == 1; }));
  CHECK(o.code == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  CHECK(o.answered == 0);
  CHECK(r.waiters.size() == 0);
}

TEST_CASE("Stopping answers every wait left and refuses new ones as UNAVAILABLE", "[waiters]") {
  Outcome left, late;
  {
    Running r(absl::Hours(1));
    r.waiters.Add(WaitFor("plan j5 0", absl::InfiniteFuture(), &left));
    REQUIRE(Eventually([&] { return r.waiters.size() == 1; }));
    r.waiters.Stop();
    r.waiters.Add(WaitFor("plan j5 1", absl::InfiniteFuture(), &late));
    CHECK(late.expired == 1);
    CHECK(late.code == static_cast<int>(absl::StatusCode::kUnavailable));
  }  // joins the loop, then ExpireAll
  CHECK(left.expired == 1);
  CHECK(left.code == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(left.answered == 0);
}

}  // namespace
}  // namespace dynapipe::planner::service
