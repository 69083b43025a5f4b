// The same behaviour checks against the Redis store (a real redis-server on a
// loopback port) and the in-memory store.
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>

#include "src/common/mutex.h"
#include "src/plan/plan_seal.h"
#include "src/store/memory_plan_store.h"
#include "src/store/redis_plan_store.h"
#include "src/testing/redis_server.h"

namespace dynapipe::store {
namespace {

proto::ExecutionPlan MakePlan(const std::string& job, int rank, int64_t iteration) {
  proto::ExecutionPlan p;
  p.set_schema_version(plan::kPlanSchemaVersion);
  p.set_job_id(job);
  p.set_iteration(iteration);
  p.set_rank(rank);
  p.set_pp_size(2);
  p.set_dp_size(1);
  p.add_instructions()->mutable_optimizer_step();
  plan::SealPlan(&p);
  return p;
}

proto::JobSpec Spec(int pp, int dp) {
  proto::JobSpec s;
  s.set_name("t");
  s.mutable_parallelism()->set_pp(pp);
  s.mutable_parallelism()->set_dp(dp);
  s.set_iterations(10);
  return s;
}

// Waits up to 5 s for `pred`.
template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return pred();
}

// The store's own count of commits of an iteration's plans (not part of
// PlanStore): 1 = exactly once.
using Writes = std::function<int64_t(const std::string& job, int64_t iteration)>;

void CheckStore(PlanStore& store, const Writes& plan_writes,
                const std::function<void(const std::string&, int64_t, int, const std::string&)>& corrupt) {
  Mutex mu;
  std::vector<std::string> events;
  store.SetListener([&](const std::string& e) {
    MutexLock lock(&mu);
    events.push_back(e);
  });

  auto id = store.CreateJob(Spec(2, 1), 0, 1000);
  REQUIRE(id.ok());
  // The id names the store: job-STOREID-000001.
  const auto store_id = store.StoreId();
  REQUIRE(store_id.ok());
  CHECK(store_id->size() == 8);
  CHECK(*id == "job-" + *store_id + "-000001");
  CHECK(*store.StoreId() == *store_id);  // stable
  auto job = store.GetJob(*id);
  REQUIRE(job.ok());
  CHECK(job->state() == proto::JobState::pending);
  CHECK(job->spec().parallelism().pp() == 2);
  CHECK(job->plans_ready() == -1);
  CHECK(job->iterations_done() == 0);
  CHECK(job->start_iteration() == 0);
  CHECK(store.GetJob("job-999999").status().code() == absl::StatusCode::kNotFound);
  CHECK(store.GetJob("job-999999").status().message() == "job job-999999 not found");
  // A caller's id is echoed as one line, its odd bytes escaped.
  CHECK(store.GetJob("1\n*").status().message() == "job \"1\\n*\" not found");
  CHECK(store.ListJobs()->size() == 1);

  // Exactly-once commits under leases.
  CHECK(*store.TryLease(*id, 0, "planner-a", absl::Seconds(30)));
  CHECK_FALSE(*store.TryLease(*id, 0, "planner-b", absl::Seconds(30)));
  std::vector<proto::ExecutionPlan> plans = {MakePlan(*id, 0, 0), MakePlan(*id, 1, 0)};
  CHECK_FALSE(*store.CommitPlans(*id, 0, "planner-b", plans, absl::Minutes(5)));  // not its lease
  CHECK(*store.CommitPlans(*id, 0, "planner-a", plans, absl::Minutes(5)));
  CHECK_FALSE(*store.CommitPlans(*id, 0, "planner-a", plans, absl::Minutes(5)));  // already stored
  CHECK(plan_writes(*id, 0) == 1);
  CHECK(*store.IsPlanned(*id, 0));
  CHECK_FALSE(*store.IsPlanned(*id, 1));
  auto got = store.GetPlan(*id, 0, 1);
  REQUIRE(got.ok());
  CHECK(got->rank() == 1);
  CHECK(store.GetPlan(*id, 1, 0).status().code() == absl::StatusCode::kNotFound);
  CHECK(store.GetJob(*id)->plans_ready() == 0);
  REQUIRE(store.ReleaseLease(*id, 0, "planner-a").ok());
  CHECK(*store.TryLease(*id, 0, "planner-b", absl::Seconds(30)));

  // Corrupt and truncated plans are DATA_LOSS.
  const std::string good = plans[1].SerializeAsString();
  corrupt(*id, 0, 1, "garbage bytes");
  CHECK(store.GetPlan(*id, 0, 1).status().code() == absl::StatusCode::kDataLoss);
  corrupt(*id, 0, 1, good.substr(0, good.size() - 4));
  CHECK(store.GetPlan(*id, 0, 1).status().code() == absl::StatusCode::kDataLoss);
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x01;
  corrupt(*id, 0, 1, flipped);
  CHECK(store.GetPlan(*id, 0, 1).status().code() == absl::StatusCode::kDataLoss);
  // Intact, sealed plans under another plan's key (before: served as they were).
  for (const proto::ExecutionPlan& moved : {plans[0], MakePlan(*id, 1, 3), MakePlan("job-other", 1, 0)}) {
    corrupt(*id, 0, 1, moved.SerializeAsString());
    auto wrong = store.GetPlan(*id, 0, 1);
    CHECK(wrong.status().code() == absl::StatusCode::kDataLoss);
    CHECK(wrong.status().message().find("moved from another key") != std::string::npos);
  }
  corrupt(*id, 0, 1, good);
  CHECK(store.GetPlan(*id, 0, 1).ok());

  // Progress.
  proto::IterationReport r;
  r.set_job_id(*id);
  r.set_rank(0);
  r.set_iteration(3);
  REQUIRE(store.PutReport(r, absl::Minutes(5)).ok());
  r.set_iteration(1);  // late report does not move progress back
  REQUIRE(store.PutReport(r, absl::Minutes(5)).ok());
  CHECK(*store.DoneByRank(*id, 2) == std::vector<int64_t>{3, -1});
  CHECK(store.GetJob(*id)->iterations_done() == 0);
  r.set_rank(1);
  r.set_iteration(2);
  REQUIRE(store.PutReport(r, absl::Minutes(5)).ok());
  CHECK(store.GetJob(*id)->iterations_done() == 3);
  CHECK(store.GetReport(*id, 2, 1)->iteration() == 2);

  // History: one entry per iteration (a rewrite replaces it), ascending from
  // `from`, at most `limit`; none for a job that has none.
  CHECK(store.History(*id, 0, 10)->empty());
  int writes = 0;
  for (int64_t i : {2, 0, 1, 1}) {
    proto::IterationSummary h;
    h.set_iteration(i);
    h.set_loss(10.0 + i);
    h.set_tokens(100 + ++writes);  // iteration 1 keeps its second write: 104
    REQUIRE(store.PutHistory(*id, h).ok());
  }
  auto hist = store.History(*id, 0, 10);
  REQUIRE(hist.ok());
  REQUIRE(hist->size() == 3);
  CHECK(((*hist)[0].iteration() == 0 && (*hist)[1].iteration() == 1 && (*hist)[2].iteration() == 2));
  CHECK((*hist)[1].tokens() == 104);
  CHECK((*hist)[2].loss() == 12.0);
  CHECK(store.History(*id, 1, 1)->size() == 1);
  CHECK(store.History(*id, 1, 1)->front().iteration() == 1);
  CHECK(store.History(*id, 3, 10)->empty());

  // Failures keep their arrival order and do not count as progress.
  CHECK(store.Failures(*id)->empty());
  proto::IterationReport f = r;
  f.set_iteration(4);
  f.set_error("recv from rank 0 failed");
  f.set_lost_peer(0);
  REQUIRE(store.AddFailure(f, absl::Minutes(5)).ok());
  f.set_rank(0);
  f.set_error("own failure");
  f.clear_lost_peer();
  REQUIRE(store.AddFailure(f, absl::Minutes(5)).ok());
  auto failures = store.Failures(*id);
  REQUIRE(failures.ok());
  REQUIRE(failures->size() == 2);
  CHECK((*failures)[0].rank() == 1);
  CHECK((*failures)[0].lost_peer() == 0);
  CHECK((*failures)[1].error() == "own failure");
  CHECK_FALSE((*failures)[1].has_lost_peer());
  CHECK(store.GetJob(*id)->iterations_done() == 3);

  // Terminal states stick.
  CHECK(*store.SetJobState(*id, proto::JobState::running, "", 2000));
  CHECK(*store.SetJobState(*id, proto::JobState::failed, "rank 1 lost", 3000));
  CHECK_FALSE(*store.SetJobState(*id, proto::JobState::running, "", 4000));
  CHECK(store.GetJob(*id)->state() == proto::JobState::failed);
  CHECK(store.GetJob(*id)->error() == "rank 1 lost");

  // Ranks, executors, bootstrap.
  CHECK(store.RankHolder(*id, 0)->empty());
  CHECK(*store.ClaimGang(*id, {"exec-1", "exec-2"}));
  CHECK(*store.RankHolder(*id, 0) == "exec-1");
  CHECK(*store.RankHolder(*id, 1) == "exec-2");
  CHECK(store.RankHolder(*id, 2)->empty());
  CHECK(store.SeatOf("exec-2")->job == *id);
  CHECK(store.SeatOf("exec-2")->rank == 1);
  CHECK(store.SeatOf("exec-3")->job.empty());
  // All or nothing: a held rank, or an executor with a seat, changes nothing.
  const std::string other = *store.CreateJob(Spec(2, 1), 0, 1000);
  CHECK_FALSE(*store.ClaimGang(*id, {"exec-3"}));
  CHECK_FALSE(*store.ClaimGang(other, {"exec-3", "exec-1"}));
  CHECK(store.RankHolder(other, 0)->empty());
  CHECK(store.SeatOf("exec-3")->job.empty());
  // A seat released (only by its own job) frees the executor for another job.
  REQUIRE(store.ReleaseSeat("exec-1", other).ok());
  CHECK(store.SeatOf("exec-1")->job == *id);
  REQUIRE(store.ReleaseSeat("exec-1", *id).ok());
  CHECK(store.SeatOf("exec-1")->job.empty());
  CHECK(*store.RankHolder(*id, 0) == "exec-1");
  CHECK(*store.ClaimGang(other, {"exec-3", "exec-1"}));
  CHECK(store.SeatOf("exec-1")->job == other);
  // A job never goes back to pending; a pending job's reason can change.
  CHECK(*store.SetJobState(other, proto::JobState::pending, "waiting for executors", 1500));
  CHECK(store.GetJob(other)->error() == "waiting for executors");
  CHECK(*store.SetJobState(other, proto::JobState::running, "", 1600));
  CHECK_FALSE(*store.SetJobState(other, proto::JobState::pending, "late reason", 1700));
  CHECK(store.GetJob(other)->state() == proto::JobState::running);
  proto::ExecutorRecord rec;
  rec.set_executor_id("exec-1");
  rec.set_last_heartbeat_unix_ms(42);
  REQUIRE(store.PutExecutor(rec).ok());
  CHECK(store.GetExecutor("exec-1")->last_heartbeat_unix_ms() == 42);
  CHECK(store.GetExecutor("nope").status().code() == absl::StatusCode::kNotFound);
  CHECK(*store.ListExecutors() == std::vector<std::string>{"exec-1"});
  REQUIRE(store.DeleteExecutor("exec-1").ok());
  REQUIRE(store.DeleteExecutor("exec-1").ok());  // unknown: fine
  CHECK(store.SeatOf("exec-1")->job.empty());  // its seat went with it
  CHECK(store.GetExecutor("exec-1").status().code() == absl::StatusCode::kNotFound);
  CHECK(store.ListExecutors()->empty());
  CHECK(store.GetBootstrap(*id, "nccl_id").status().code() == absl::StatusCode::kNotFound);
  REQUIRE(store.SetBootstrap(*id, "nccl_id", std::string("\0\1\2", 3)).ok());
  CHECK(*store.GetBootstrap(*id, "nccl_id") == std::string("\0\1\2", 3));

  // A job created at a start iteration (resumed from a checkpoint) shows
  // every rank done up to the iteration before it.
  CHECK(store.CreateJob(Spec(2, 1), -1, 5000).status().code() == absl::StatusCode::kInvalidArgument);
  auto resumed = store.CreateJob(Spec(2, 1), 4, 5000);
  REQUIRE(resumed.ok());
  CHECK(*resumed != *id);
  auto rj = store.GetJob(*resumed);
  REQUIRE(rj.ok());
  CHECK(rj->state() == proto::JobState::pending);
  CHECK(rj->start_iteration() == 4);
  CHECK(rj->iterations_done() == 4);
  CHECK(rj->plans_ready() == -1);
  CHECK(*store.DoneByRank(*resumed, 2) == std::vector<int64_t>{3, 3});
  r.set_job_id(*resumed);
  r.set_rank(0);
  r.set_iteration(1);  // a stray report from before the start moves nothing back
  REQUIRE(store.PutReport(r, absl::Minutes(5)).ok());
  r.set_iteration(4);
  REQUIRE(store.PutReport(r, absl::Minutes(5)).ok());
  CHECK(store.GetJob(*resumed)->iterations_done() == 4);
  r.set_rank(1);
  REQUIRE(store.PutReport(r, absl::Minutes(5)).ok());
  CHECK(store.GetJob(*resumed)->iterations_done() == 5);
  CHECK(store.GetJob(*id)->start_iteration() == 0);

  // Checkpoints: complete only once every rank's shard is marked.
  const std::string dir = "/ckpt/run";
  CHECK(*store.LatestCheckpoint(dir) == -1);
  CHECK_FALSE(*store.MarkCheckpointShard(*id, dir, 3, 0, 2));
  CHECK_FALSE(*store.MarkCheckpointShard(*id, dir, 3, 0, 2));  // a repeated mark counts once
  CHECK(*store.LatestCheckpoint(dir) == -1);
  CHECK(*store.MarkCheckpointShard(*id, dir, 3, 1, 2));
  CHECK(*store.LatestCheckpoint(dir) == 3);
  CHECK_FALSE(*store.MarkCheckpointShard(*id, dir, 3, 1, 2));  // completed once, not again
  CHECK_FALSE(*store.MarkCheckpointShard(*id, dir, 5, 1, 2));  // rank 0 of 5 missing
  CHECK(*store.LatestCheckpoint(dir) == 3);
  CHECK_FALSE(*store.MarkCheckpointShard(*id, dir, 1, 0, 2));
  CHECK(*store.MarkCheckpointShard(*id, dir, 1, 1, 2));  // completes late: never lowers the latest
  CHECK(*store.LatestCheckpoint(dir) == 3);
  CHECK_FALSE(*store.MarkCheckpointShard(*resumed, dir, 5, 0, 2));  // ranks are counted per job
  CHECK(*store.LatestCheckpoint(dir) == 3);
  CHECK_FALSE(*store.MarkCheckpointShard(*resumed, dir, 7, 1, 2));
  CHECK(*store.MarkCheckpointShard(*resumed, dir, 7, 0, 2));  // the resubmitted job continues the dir
  CHECK(*store.LatestCheckpoint(dir) == 7);
  CHECK(*store.LatestCheckpoint("/ckpt/other") == -1);
  CHECK(store.MarkCheckpointShard(*id, dir, 9, 2, 2).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(store.MarkCheckpointShard(*id, dir, -1, 0, 2).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(store.MarkCheckpointShard(*id, "", 9, 0, 2).status().code() == absl::StatusCode::kInvalidArgument);
  // Ranks marking at once: exactly one call completes the checkpoint.
  constexpr int kWorld = 8;
  std::atomic<int> completed{0};
  std::vector<std::thread> markers;
  for (int k = 0; k < kWorld; ++k) {
    markers.emplace_back([&, k] {
      auto done = store.MarkCheckpointShard(*resumed, dir, 20, k, kWorld);
      if (done.ok() && *done) ++completed;
    });
  }
  for (auto& t : markers) t.join();
  CHECK(completed == 1);
  CHECK(*store.LatestCheckpoint(dir) == 20);

  CHECK(Eventually([&] {
    MutexLock lock(&mu);
    return std::find(events.begin(), events.end(), "plan " + *id + " 0") != events.end() &&
           std::find(events.begin(), events.end(), "bootstrap " + *id + " nccl_id") != events.end();
  }));
  store.SetListener(nullptr);
}

}  // namespace

// Overwrites a stored plan's bytes, for the corruption checks.
class MemoryPlanStoreTestPeer {
 public:
  static void CorruptPlan(MemoryPlanStore& store, const std::string& job, int64_t iteration, int rank,
                          const std::string& bytes) {
    MutexLock lock(&store.mu_);
    store.jobs_[job].plans[{iteration, rank}] = bytes;
  }
};

namespace {

TEST_CASE("In-memory store") {
  MemoryPlanStore store;
  CheckStore(
      store, [&](const std::string& j, int64_t i) { return *store.PlanWrites(j, i); },
      [&](const std::string& j, int64_t i, int r, const std::string& b) {
        MemoryPlanStoreTestPeer::CorruptPlan(store, j, i, r, b);
      });
}

TEST_CASE("Redis store against a real redis-server") {
  auto server = testing::RedisServer::Start();
  REQUIRE(server.ok());
  RedisOptions o;
  o.port = (*server)->port();
  RedisPlanStore store(o, "test:");
  // Give the subscriber its connection before events are published.
  REQUIRE(Eventually([&] { return store.client().Command({"PUBSUB", "NUMSUB", "test:events"}).ok() &&
                                  store.client().Command({"PUBSUB", "NUMSUB", "test:events"})->elements[1].integer == 1; }));
  CheckStore(
      store, [&](const std::string& j, int64_t i) { return *store.PlanWrites(j, i); },
      [&](const std::string& j, int64_t i, int r, const std::string& b) {
        REQUIRE(store.client().Command({"SET", store.keys().Plan(j, i, r), b}).ok());
      });
}

TEST_CASE("Redis client reports UNAVAILABLE while Redis is down and recovers by itself") {
  auto server = testing::RedisServer::Start();
  REQUIRE(server.ok());
  RedisOptions o;
  o.port = (*server)->port();
  o.pool_size = 2;
  o.command_timeout = absl::Milliseconds(500);
  RedisClient client(o);
  REQUIRE(client.Command({"SET", "k", "v"}).ok());
  CHECK(client.healthy());
  CHECK(client.last_trouble() == absl::InfinitePast());
  (*server)->Stop();
  const absl::Time t0 = absl::Now();
  auto down = client.Command({"GET", "k"});
  CHECK(down.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::Now() - t0 < absl::Seconds(3));  // fails fast, no hang
  CHECK_FALSE(client.healthy());
  CHECK(client.errors() >= 1);
  CHECK(client.last_trouble() >= t0);  // remembered after Redis is back, unlike healthy()
  REQUIRE((*server)->Restart().ok());
  CHECK(Eventually([&] { return client.Command({"PING"}).ok(); }));
  CHECK(client.healthy());
  CHECK(client.last_trouble() >= t0);
}

TEST_CASE("A Redis restarted empty has a new store id, so no job id is handed out twice") {
  auto server = testing::RedisServer::Start();
  REQUIRE(server.ok());
  RedisOptions o;
  o.port = (*server)->port();
  RedisPlanStore store(o, "test:");
  const auto before = store.StoreId();
  REQUIRE(before.ok());
  auto first = store.CreateJob(Spec(2, 1), 0, 1000);
  REQUIRE(first.ok());
  (*server)->Stop();  // not persistent: the data is gone
  REQUIRE((*server)->Restart().ok());
  REQUIRE(Eventually([&] { return store.client().Command({"PING"}).ok(); }));
  auto second = store.CreateJob(Spec(2, 1), 0, 2000);  // the first job after the loss makes the new id
  REQUIRE(second.ok());
  const auto after = store.StoreId();
  REQUIRE(after.ok());
  CHECK(*after != *before);
  CHECK(*second != *first);
  CHECK(*second == "job-" + *after + "-000001");
  CHECK(store.GetJob(*first).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("Redis AUTH: a wrong password is UNAUTHENTICATED") {
  auto server = testing::RedisServer::Start();
  REQUIRE(server.ok());
  RedisOptions admin;
  admin.port = (*server)->port();
  RedisClient root(admin);
  REQUIRE(root.Command({"CONFIG", "SET", "requirepass", "s3cret"}).ok());
  RedisOptions bad = admin;
  bad.password = "wrong";
  RedisClient wrong(bad);
  CHECK(wrong.Command({"PING"}).status().code() == absl::StatusCode::kUnauthenticated);
  RedisOptions good = admin;
  good.password = "s3cret";
  RedisClient right(good);
  CHECK(right.Command({"PING"}).ok());
}

}  // namespace
}  // namespace dynapipe::store
