// Every daemon exits within 2 s of SIGTERM, whatever it is waiting on: an
// executor whose planner never came up, was SIGKILLed or is frozen; executors
// mid-training and waiting on a frozen peer; a planner whose Redis is frozen
// or gone. (Schedulers SIGKILL what is still there 10-60 s later, and an
// executor once sat out its whole --planner-grace-s in a retry.)
#include <signal.h>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/testing/redis_server.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/integration/training_fixture.h"

namespace dynapipe::testing {
namespace {

constexpr absl::Duration kExitLimit = absl::Seconds(2);

// Sends SIGTERM and checks the process exits (not killed by the signal)
// within kExitLimit. A ChildProcess or a PlannerProcess; one still there after
// 20 s is SIGKILLed by its destructor.
template <typename Process>
void CheckPromptExit(Process* p, const std::string& what) {
  const absl::Time start = absl::Now();
  p->Signal(SIGTERM);
  const double s = p->Exited(absl::Seconds(20)) ? absl::ToDoubleSeconds(absl::Now() - start) : -1;
  INFO(what << ": " << s << " s after SIGTERM (negative: still running after 20 s)");
  CHECK(s >= 0);
  CHECK(s <= absl::ToDoubleSeconds(kExitLimit));
  CHECK(WIFEXITED(p->wait_status()));  // exited, not killed by the signal
}

ExecutorProcessOptions Executor(const std::string& planner, int device) {
  ExecutorProcessOptions o;
  o.planner = planner;
  o.device = device;
  o.extra = {"--planner_grace_s=60"};
  return o;
}

bool Registered(const std::string& address, int n) {
  auto list = Client(address)->Executors();
  return list.ok() && list->executors_size() >= n;
}

TEST_CASE("SIGTERM ends an executor within 2 s while its planner is down, frozen or never came up") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  SECTION("never came up: in the registration's retries") {
    auto port = PickFreeLoopbackPort();
    REQUIRE(port.ok());
    auto e = StartExecutor(Executor(absl::StrCat("127.0.0.1:", *port), 0));
    absl::SleepFor(absl::Milliseconds(1500));
    CheckPromptExit(e.get(), "planner never up");
  }
  SECTION("SIGKILLed after the executor registered: in a heartbeat's retries") {
    auto planner = PlannerProcess::Start((*redis)->port(), {});
    REQUIRE(planner.ok());
    auto e = StartExecutor(Executor((*planner)->address(), 0));
    REQUIRE(Eventually([&] { return Registered((*planner)->address(), 1); }));
    (*planner)->Signal(SIGKILL);
    REQUIRE((*planner)->Exited(absl::Seconds(5)));
    absl::SleepFor(absl::Milliseconds(1500));
    CheckPromptExit(e.get(), "planner SIGKILLed");
  }
  SECTION("SIGSTOPped: a heartbeat waits on an open connection that never answers") {
    auto planner = PlannerProcess::Start((*redis)->port(), {});
    REQUIRE(planner.ok());
    auto e = StartExecutor(Executor((*planner)->address(), 0));
    REQUIRE(Eventually([&] { return Registered((*planner)->address(), 1); }));
    (*planner)->Signal(SIGSTOP);
    absl::SleepFor(absl::Milliseconds(1500));
    CheckPromptExit(e.get(), "planner SIGSTOPped");
    (*planner)->Signal(SIGCONT);
  }
}

TEST_CASE("SIGTERM ends executors within 2 s mid-training and while waiting on a frozen peer",
          "[executor][integration]") {
  Stack stack = StartStack("", absl::Seconds(5));
  auto client = Client(stack.address());
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(Executor(stack.address(), d)));
  auto job = client->Submit(TrainJob(100000, "", 0));
  REQUIRE(job.ok());
  REQUIRE(Eventually(
      [&] {
        auto st = client->Get(*job);
        return st.ok() && st->iterations_done() >= 3;
      },
      absl::Seconds(60)));
  SECTION("mid-training, one after another") {
    for (int d = 0; d < 4; ++d) CheckPromptExit(executors[d].get(), absl::StrCat("executor ", d));
  }
  SECTION("a peer frozen: the others wait on it") {
    executors[3]->Signal(SIGSTOP);
    absl::SleepFor(absl::Milliseconds(1500));
    for (int d = 0; d < 3; ++d) CheckPromptExit(executors[d].get(), absl::StrCat("executor ", d));
    executors[3]->Signal(SIGCONT);
    CheckPromptExit(executors[3].get(), "the thawed executor");
  }
}

TEST_CASE("SIGTERM ends a planner within 2 s while its Redis is frozen or gone") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  auto planner = PlannerProcess::Start((*redis)->port(), {});
  REQUIRE(planner.ok());
  // Work that touches the store: a job being planned ahead, its executors
  // heartbeating and fetching plans.
  const auto job = RunSimulatedJob((*planner)->address(), SmallJob(2, 2, 1000, 8), absl::Milliseconds(20));
  REQUIRE(Eventually([&] { return job->ranks[0]->done >= 2; }));
  SECTION("frozen") {
    REQUIRE(::kill((*redis)->pid(), SIGSTOP) == 0);
    absl::SleepFor(absl::Milliseconds(1500));
    CheckPromptExit(planner->get(), "planner with Redis frozen");
    ::kill((*redis)->pid(), SIGCONT);
  }
  SECTION("gone") {
    (*redis)->Stop();
    absl::SleepFor(absl::Milliseconds(1500));
    CheckPromptExit(planner->get(), "planner with Redis gone");
  }
}

}  // namespace
}  // namespace dynapipe::testing
