// ExecutorRegistry over the in-memory store and a fake clock: identity,
// placement of a pending job's gang through heartbeats, and executors given
// up on after heartbeat_timeout.
#include "planner/service/executor_registry.h"

#include <catch2/catch.hpp>
#include <thread>

#include "planner/testing/test_specs.h"
#include "src/spec/job_spec.h"
#include "src/store/memory_plan_store.h"
#include "src/common/status_macros.h"
#include "src/testing/status_require.h"

namespace dynapipe::planner::service {
namespace {

using Catch::Matchers::Contains;

struct Registry {
  Registry()
      : registry(&store, &known, [this] { return Jobs(); },
                 {absl::Seconds(1), absl::Seconds(10), absl::Minutes(10), &clock}) {}
  absl::StatusOr<std::vector<proto::JobStatus>> Jobs() {
    std::vector<proto::JobStatus> out;
    ASSIGN_OR_RETURN(const auto ids, store.ListJobs());
    for (const auto& id : ids) {
      ASSIGN_OR_RETURN(proto::JobStatus s, store.GetJob(id));
      out.push_back(std::move(s));
    }
    return out;
  }
  // Registers an executor on `node` and sends its first heartbeat.
  rpc::ExecutorCredential Join(const std::string& node) {
    proto::RegisterExecutorRequest req;
    req.set_node(node);
    req.set_backend(proto::Backend::cpu);
    auto r = registry.Register(req);
    REQUIRE_OK(r.status());
    REQUIRE_OK(Beat(r->executor_id()).status());
    return {r->executor_id(), r->executor_secret()};
  }
  absl::StatusOr<proto::HeartbeatResponse> Beat(const std::string& id) {
    proto::HeartbeatRequest hb;
    hb.set_executor_id(id);
    return registry.Heartbeat(hb);
  }
  // A pending job of pp 2.
  std::string Submit() {
    proto::JobSpec s;
    *s.mutable_model() = testing::Gpt(4, 256, 4);
    *s.mutable_cluster() = testing::H100Cluster();
    s.mutable_parallelism()->set_pp(2);
    s.mutable_dataset()->set_path("lengths.txt");
    s.mutable_dataset()->set_format(proto::DatasetSpec::lengths);
    s.mutable_batching()->set_global_batch_tokens(8192);
    s.set_iterations(4);
    auto n = spec::NormalizeJobSpec(s);
    REQUIRE_OK(n.status());
    auto id = store.CreateJob(*n, 0, absl::ToUnixMillis(clock.Now()));
    REQUIRE_OK(id.status());
    registry.JobSubmitted();
    return *id;
  }
  FakeClock clock;
  store::MemoryPlanStore store;
  LastKnown known;
  ExecutorRegistry registry;
};

TEST_CASE("Registration gives a credential that authenticates its executor and no other", "[registry]") {
  Registry r;
  const rpc::ExecutorCredential a = r.Join("node-a");
  ASSIGN_OR_REQUIRE(const proto::ExecutorRecord rec, r.registry.AuthenticateExecutor(a));
  CHECK(rec.executor_id() == a.executor_id);
  CHECK(rec.info().node() == "node-a");
  const rpc::ExecutorCredential wrong{a.executor_id, std::string(a.secret.size(), '0')};
  CHECK(r.registry.AuthenticateExecutor(wrong).status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(r.registry.AuthenticateExecutor({}).status().code() == absl::StatusCode::kUnauthenticated);
  const rpc::ExecutorCredential b = r.Join("node-b");
  proto::HeartbeatRequest hb;
  hb.set_executor_id(b.executor_id);
  CHECK(r.registry.AuthorizeHeartbeat(a, hb).code() == absl::StatusCode::kPermissionDenied);
  CHECK(r.registry.AuthorizeJobMember(a, "1").code() == absl::StatusCode::kPermissionDenied);
  // Records come back without the secrets' hashes.
  ASSIGN_OR_REQUIRE(const auto records, r.registry.Executors());
  REQUIRE(records.size() == 2);
  for (const auto& e : records) CHECK(e.secret_sha256().empty());
  proto::RegisterExecutorRequest bad;
  bad.set_node("has space");
  bad.set_backend(proto::Backend::cpu);
  CHECK_THAT(std::string(r.registry.Register(bad).status().message()), Contains("node:"));
}

TEST_CASE("Heartbeats of idle executors place a pending job's whole gang and start it", "[registry]") {
  Registry r;
  const rpc::ExecutorCredential a = r.Join("node-a");
  const std::string job = r.Submit();
  // One idle executor cannot hold a gang of two: the job waits, saying why.
  ASSIGN_OR_REQUIRE(const proto::HeartbeatResponse alone, r.Beat(a.executor_id));
  CHECK(alone.assignment().job_id().empty());
  ASSIGN_OR_REQUIRE(const proto::JobStatus waiting, r.store.GetJob(job));
  CHECK(waiting.state() == proto::JobState::pending);
  CHECK_FALSE(waiting.error().empty());
  const rpc::ExecutorCredential b = r.Join("node-b");
  r.clock.Advance(absl::Seconds(1));  // past the eager pass's interval (real time: it is 100 ms)
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSIGN_OR_REQUIRE(const proto::HeartbeatResponse first, r.Beat(b.executor_id));
  ASSIGN_OR_REQUIRE(const proto::HeartbeatResponse second, r.Beat(a.executor_id));
  CHECK(first.assignment().job_id() == job);
  CHECK(second.assignment().job_id() == job);
  CHECK(first.assignment().rank() != second.assignment().rank());
  CHECK(first.assignment().world_size() == 2);
  ASSIGN_OR_REQUIRE(const proto::JobStatus running, r.store.GetJob(job));
  CHECK(running.state() == proto::JobState::running);
  CHECK(r.registry.AuthorizeJobMember(a, job).ok());
}

TEST_CASE("An executor silent past the heartbeat timeout is lost and fails its job", "[registry]") {
  Registry r;
  const rpc::ExecutorCredential a = r.Join("node-a");
  const rpc::ExecutorCredential b = r.Join("node-b");
  const std::string job = r.Submit();
  ASSIGN_OR_REQUIRE(auto jobs, r.Jobs());
  REQUIRE_OK(r.registry.PlaceWaitingJobs(jobs, nullptr));
  REQUIRE(r.Beat(a.executor_id).ok());
  REQUIRE(r.Beat(b.executor_id).ok());
  r.clock.Advance(absl::Seconds(5));
  REQUIRE(r.Beat(a.executor_id).ok());
  ASSIGN_OR_REQUIRE(auto records, r.registry.Executors());
  r.registry.MarkLost(&records);  // within the timeout: nobody lost
  ASSIGN_OR_REQUIRE(const proto::JobStatus before, r.store.GetJob(job));
  CHECK(before.state() == proto::JobState::running);
  r.clock.Advance(absl::Seconds(6));  // b silent for 11 s, a for 6 s
  ASSIGN_OR_REQUIRE(records, r.registry.Executors());
  r.registry.MarkLost(&records);
  ASSIGN_OR_REQUIRE(const proto::ExecutorRecord lost, r.store.GetExecutor(b.executor_id));
  ASSIGN_OR_REQUIRE(const proto::ExecutorRecord live, r.store.GetExecutor(a.executor_id));
  CHECK(lost.lost());
  CHECK_FALSE(live.lost());
  ASSIGN_OR_REQUIRE(const proto::JobStatus after, r.store.GetJob(job));
  CHECK(after.state() == proto::JobState::failed);
  CHECK_THAT(after.error(), Contains(b.executor_id));
  // A lost executor that comes back is told to stop its job, then is idle.
  ASSIGN_OR_REQUIRE(const proto::HeartbeatResponse back, r.Beat(b.executor_id));
  CHECK(back.stop());
}

}  // namespace
}  // namespace dynapipe::planner::service
