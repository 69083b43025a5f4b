// Checkpoints across the control plane (real Redis, in-process planner, gRPC):
// ranks write their shards (src/checkpoint) and report them; the
// checkpoint counts only once every rank has; a job resubmitted with
// checkpoint.resume starts after the latest complete one.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "src/checkpoint/checkpoint.h"
#include "src/store/redis_plan_store.h"
#include "tests/integration/control_plane_fixture.h"
#include "src/spec/normalized_for_test.h"

namespace dynapipe::testing {
namespace {

using Catch::Matchers::Contains;
namespace ckpt = checkpoint;

// The value of a counter or gauge in Prometheus text; -1 if absent.
double Metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + name.size() + 2));
}

TEST_CASE("A checkpoint counts once every rank reports its shard; a resubmitted job resumes after the latest") {
  Stack s = StartStack();
  auto client = Client(s.address());
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/ckpt-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  proto::JobSpec spec = SmallJob(2, 1, 10, 2);
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_interval(2);
  const uint64_t fingerprint = ckpt::JobFingerprint(spec::NormalizedForTest(spec));
  store::RedisOptions ro;
  ro.port = s.redis->port();
  store::RedisPlanStore store(ro);  // the planner's own keys, read directly

  // What an executor does after iteration `it`: write its shard when it is a
  // checkpoint iteration, then report the iteration.
  std::vector<float> weights(33);
  std::vector<JoinedExecutor> executors;  // of the job running now; index = rank
  auto run = [&](const std::string& job, int64_t it, int rank, bool checkpoint) {
    if (checkpoint) {
      ckpt::ShardRef shard;
      shard.iteration = it;
      shard.rank = rank;
      shard.pp_rank = rank;
      shard.world = 2;
      shard.optimizer_step = it + 1;
      shard.job_fingerprint = fingerprint;
      weights.assign(weights.size(), static_cast<float>(100 * it + rank));
      shard.params = {{"stage.w", weights}};
      REQUIRE(ckpt::WriteShard(dir, shard).ok());
    }
    proto::IterationReport r;
    r.set_job_id(job);
    r.set_iteration(it);
    r.set_rank(rank);
    r.set_checkpoint_written(checkpoint);
    return executors[rank].client->ReportIteration(r);
  };

  auto first = client->Submit(spec);
  REQUIRE(first.ok());
  CHECK(client->Get(*first)->start_iteration() == 0);
  executors = JoinJob(s.address(), *first, 2);
  // Both ranks checkpoint iteration 1; at iteration 3 rank 1 dies before writing its shard.
  for (int64_t it = 0; it < 4; ++it) {
    for (int rank = 0; rank < 2; ++rank) {
      const bool checkpoint = it == 1 || (it == 3 && rank == 0);
      if (it == 3 && rank == 1) continue;
      REQUIRE(run(*first, it, rank, checkpoint).ok());
      if (it == 1 && rank == 0) CHECK(*store.LatestCheckpoint(dir) == -1);  // one rank of two: not yet
    }
  }
  CHECK(*store.LatestCheckpoint(dir) == 1);
  REQUIRE(run(*first, 3, 0, true).ok());  // a retried report counts once
  CHECK(*store.LatestCheckpoint(dir) == 1);
  CHECK(*ckpt::LatestCompleteOnDisk(dir, 2) == 1);  // the files agree
  const std::string metrics = s.planner->service().MetricsText();
  CHECK(Metric(metrics, "dynapipe_checkpoints_complete_total") == 1);
  CHECK(Metric(metrics, "dynapipe_checkpoint_shards_total") == 4);
  REQUIRE(client->Cancel(*first).ok());

  // Resubmitted with resume: starts at iteration 2.
  spec.mutable_checkpoint()->set_resume(true);
  auto second = client->Submit(spec);
  REQUIRE(second.ok());
  auto status = client->Get(*second);
  REQUIRE(status.ok());
  CHECK(status->start_iteration() == 2);
  CHECK(status->iterations_done() == 2);
  // Planning starts there (look-ahead 2: iterations 2 and 3), nothing before it.
  REQUIRE(Eventually([&] { return client->Get(*second)->plans_ready() == 3; }));
  CHECK_FALSE(*store.IsPlanned(*second, 0));
  CHECK_FALSE(*store.IsPlanned(*second, 1));
  CHECK(client->FetchPlan(*second, 2, 1, absl::Seconds(5)).ok());
  auto early = client->FetchPlan(*second, 1, 0, absl::Seconds(1));
  CHECK(early.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(early.status().message()), Contains("(2..9)"));

  // Executors are told where to start, and find their shards of iteration 1.
  executors = JoinJob(s.address(), *second, 2);
  proto::IterationReport stale;
  stale.set_job_id(*second);
  stale.set_iteration(1);
  CHECK(executors[0].client->ReportIteration(stale).code() == absl::StatusCode::kInvalidArgument);
  for (const JoinedExecutor& e : executors) {
    const proto::Assignment& a = e.assignment;
    CHECK(a.job_id() == *second);
    CHECK(a.start_iteration() == 2);
    auto shard = ckpt::ReadShard(dir, a.start_iteration() - 1, a.rank());
    REQUIRE(shard.ok());
    ckpt::ShardInfo want;
    want.job_fingerprint = ckpt::JobFingerprint(spec::NormalizedForTest(client->Get(*second)->spec()));
    want.world = a.world_size();
    want.rank = a.rank();
    want.pp_rank = a.pp_rank();
    want.dp_rank = a.dp_rank();
    CHECK(ckpt::CheckSameJob(want, *shard).ok());
    CHECK(shard->params[0].data[0] == static_cast<float>(100 + a.rank()));
  }
  CHECK(client->Get(*second)->state() == proto::JobState::running);

  // The resumed job completes the checkpoint of iteration 3 (its own ranks count).
  for (int64_t it = 2; it < 4; ++it) {
    for (int rank = 0; rank < 2; ++rank) REQUIRE(run(*second, it, rank, it == 3).ok());
  }
  CHECK(*store.LatestCheckpoint(dir) == 3);
  CHECK(client->Get(*second)->iterations_done() == 4);
  CHECK(Metric(s.planner->service().MetricsText(), "dynapipe_checkpoints_complete_total") == 2);
  REQUIRE(client->Cancel(*second).ok());

  // The same directory spelled with a trailing slash resumes from it too.
  spec.mutable_checkpoint()->set_dir(dir + "/");
  auto third = client->Submit(spec);
  REQUIRE(third.ok());
  CHECK(client->Get(*third)->iterations_done() == 4);
  // Nothing left to run: refused, and nothing stored.
  const int jobs = client->List()->jobs_size();
  spec.set_iterations(4);
  auto done = client->Submit(spec);
  CHECK(done.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(done.status().message()), Contains("checkpoint.resume") && Contains("iteration 3"));
  CHECK(client->List()->jobs_size() == jobs);
  // No checkpoint recorded for a directory: resume starts at 0.
  spec.set_iterations(10);
  spec.mutable_checkpoint()->set_dir(dir + "-empty");
  auto fresh = client->Submit(spec);
  REQUIRE(fresh.ok());
  CHECK(client->Get(*fresh)->iterations_done() == 0);
  CHECK(client->Get(*fresh)->start_iteration() == 0);
  // Resuming needs a directory.
  spec.mutable_checkpoint()->clear_dir();
  auto nodir = client->Submit(spec);
  CHECK(nodir.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(nodir.status().message()), Contains("checkpoint.dir"));
}

TEST_CASE("checkpoint_written on a job without a checkpoint dir changes nothing") {
  Stack s = StartStack();
  auto client = Client(s.address());
  auto id = client->Submit(SmallJob(2, 1, 4, 2));
  REQUIRE(id.ok());
  std::vector<JoinedExecutor> executors = JoinJob(s.address(), *id, 2);
  proto::IterationReport r;
  r.set_job_id(*id);
  r.set_iteration(0);
  r.set_checkpoint_written(true);
  for (int rank = 0; rank < 2; ++rank) {
    r.set_rank(rank);
    REQUIRE(executors[rank].client->ReportIteration(r).ok());
  }
  CHECK(client->Get(*id)->iterations_done() == 1);
  CHECK(Metric(s.planner->service().MetricsText(), "dynapipe_checkpoint_shards_total") == -1);
}

}  // namespace
}  // namespace dynapipe::testing
