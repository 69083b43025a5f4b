// Planner processes (the real dynapipe-planner binary) sharing one Redis:
// every iteration is planned exactly once, a SIGKILLed planner's work is
// taken over, and a restarted planner resumes from Redis.
#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"

#include "src/common/mutex.h"
#include "src/store/redis_plan_store.h"
#include "src/testing/redis_server.h"
#include "tests/integration/control_plane_fixture.h"

namespace dynapipe::testing {
namespace {

void CheckExactlyOnce(int redis_port, const std::string& job, int iterations) {
  store::RedisOptions o;
  o.port = redis_port;
  store::RedisPlanStore store(o);
  for (int i = 0; i < iterations; ++i) {
    INFO("iteration " << i);
    CHECK(*store.PlanWrites(job, i) == 1);
  }
}

TEST_CASE("Two planners share the work exactly once; after one is SIGKILLed the other finishes") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const int port = (*redis)->port();
  const std::vector<std::string> flags = {"--lease_ttl_ms=1000", "--planning_threads=1"};
  auto a = PlannerProcess::Start(port, flags);
  auto b = PlannerProcess::Start(port, flags);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const int kIters = 24;
  auto id = Client((*a)->address())->Submit(SmallJob(2, 2, kIters, 4));
  REQUIRE(id.ok());

  // Executors talk to planner a until it dies, then to b.
  std::atomic<bool> a_alive{true}, stop{false};
  const std::string addr_a = (*a)->address(), addr_b = (*b)->address();
  auto address = [&] { return a_alive ? addr_a : addr_b; };
  std::vector<std::unique_ptr<SimulatedRank>> ranks;
  const std::vector<JoinedExecutor> executors = JoinJob(addr_a, *id, 4);
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(RunRank(address, *id, r, executors[r].credential, kIters, absl::Milliseconds(40), &stop));
  }
  REQUIRE(Eventually([&] { return ranks[0]->done >= 8; }, absl::Seconds(30)));
  (*a)->Signal(SIGKILL);
  REQUIRE((*a)->Exited(absl::Seconds(5)));
  a_alive = false;
  for (auto& r : ranks) {
    r->thread.join();
    INFO(r->status.ToString());
    CHECK(r->status.ok());
    CHECK(r->done == kIters - 1);
  }
  auto st = Client(addr_b)->Get(*id);
  REQUIRE(st.ok());
  CHECK(st->state() == proto::JobState::succeeded);
  CheckExactlyOnce(port, *id, kIters);
}

TEST_CASE("A planner restarted mid-job resumes from Redis: nothing lost, nothing planned twice") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const int port = (*redis)->port();
  auto first = PlannerProcess::Start(port, {"--lease_ttl_ms=1000"});
  REQUIRE(first.ok());
  const int kIters = 16;
  std::string address = (*first)->address();
  auto id = Client(address)->Submit(SmallJob(2, 1, kIters, 3));
  REQUIRE(id.ok());
  Mutex mu;
  std::string current = address;
  auto addr = [&] {
    MutexLock lock(&mu);
    return current;
  };
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<SimulatedRank>> ranks;
  const std::vector<JoinedExecutor> executors = JoinJob(address, *id, 2);
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(RunRank(addr, *id, r, executors[r].credential, kIters, absl::Milliseconds(40), &stop));
  }
  REQUIRE(Eventually([&] { return ranks[1]->done >= 5; }, absl::Seconds(30)));
  (*first)->Signal(SIGTERM);  // clean drain
  CHECK((*first)->Exited(absl::Seconds(10)));
  auto second = PlannerProcess::Start(port, {"--lease_ttl_ms=1000"});
  REQUIRE(second.ok());
  {
    MutexLock lock(&mu);
    current = (*second)->address();
  }
  for (auto& r : ranks) {
    r->thread.join();
    INFO(r->status.ToString());
    CHECK(r->status.ok());
  }
  CHECK(Client((*second)->address())->Get(*id)->state() == proto::JobState::succeeded);
  CheckExactlyOnce(port, *id, kIters);
}

}  // namespace
TEST_CASE("A second planner on a port already taken refuses to start instead of sharing it") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  auto a = PlannerProcess::Start((*redis)->port(), {});
  REQUIRE(a.ok());
  auto b = PlannerProcess::Start((*redis)->port(), {absl::StrCat("--listen=127.0.0.1:", (*a)->port())});
  CHECK_FALSE(b.ok());
}

}  // namespace dynapipe::testing
