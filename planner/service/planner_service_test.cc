// PlannerService over the in-memory store: checkpoint completion from the
// ranks' reports and jobs resumed from the latest complete checkpoint. The
// same over Redis and gRPC: tests/integration/checkpoint_resume_test.cc.
#include "planner/service/planner_service.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "planner/testing/test_specs.h"
#include "src/common/clock.h"
#include "src/common/file_util.h"
#include "src/store/memory_plan_store.h"

namespace dynapipe::planner::service {
namespace {

using Catch::Matchers::Contains;

// A 2-stage GPT job on a lengths file of 300 samples.
proto::JobSpec Job(int iterations, const std::string& checkpoint_dir) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string lengths = std::string(tmp ? tmp : "/tmp") + "/lengths-" + std::to_string(::getpid()) + ".txt";
  std::mt19937 rng(7);
  std::string text;
  for (int i = 0; i < 300; ++i) text += std::to_string(std::uniform_int_distribution<int>(16, 512)(rng)) + "\n";
  REQUIRE(WriteFileAtomic(lengths, text).ok());
  proto::JobSpec s;
  s.set_name("svc");
  *s.mutable_model() = testing::Gpt(4, 256, 4);
  *s.mutable_cluster() = testing::H100Cluster();
  s.mutable_parallelism()->set_pp(2);
  s.mutable_dataset()->set_path(lengths);
  s.mutable_dataset()->set_format(proto::DatasetSpec::lengths);
  s.mutable_batching()->set_global_batch_tokens(8192);
  s.mutable_batching()->set_max_seq_len(512);
  s.set_iterations(iterations);
  s.set_planner_lookahead(2);
  s.mutable_checkpoint()->set_dir(checkpoint_dir);
  s.mutable_checkpoint()->set_interval(2);
  return s;
}

absl::Status Report(PlannerService& svc, const std::string& job, int64_t iteration, int rank, bool checkpoint) {
  proto::IterationReport r;
  r.set_job_id(job);
  r.set_iteration(iteration);
  r.set_rank(rank);
  r.set_checkpoint_written(checkpoint);
  return svc.ReportIteration(r);
}

absl::StatusOr<std::string> Submit(PlannerService& svc, const proto::JobSpec& spec) {
  proto::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  auto resp = svc.Submit(req);
  if (!resp.ok()) return resp.status();
  return resp->job_id();
}

TEST_CASE("A checkpoint is complete once every rank reports its shard, not before") {
  store::MemoryPlanStore store;
  PlannerService svc(&store, ServiceOptions());
  auto id = Submit(svc, Job(10, "/ckpt/a"));
  REQUIRE(id.ok());
  REQUIRE(Report(svc, *id, 0, 0, false).ok());
  REQUIRE(Report(svc, *id, 0, 1, false).ok());
  REQUIRE(Report(svc, *id, 1, 0, true).ok());
  CHECK(*store.LatestCheckpoint("/ckpt/a") == -1);  // rank 1 missing
  REQUIRE(Report(svc, *id, 1, 0, true).ok());       // a retry is not rank 1
  CHECK(*store.LatestCheckpoint("/ckpt/a") == -1);
  REQUIRE(Report(svc, *id, 1, 1, true).ok());
  CHECK(*store.LatestCheckpoint("/ckpt/a") == 1);
  REQUIRE(Report(svc, *id, 3, 1, true).ok());  // rank 0 never writes 3
  CHECK(*store.LatestCheckpoint("/ckpt/a") == 1);
  CHECK_THAT(svc.MetricsText(), Contains("dynapipe_checkpoints_complete_total 1\n") &&
                                    Contains("dynapipe_checkpoint_shards_total 4\n"));
  // Validation runs before anything is marked.
  CHECK(Report(svc, *id, 10, 0, true).code() == absl::StatusCode::kInvalidArgument);
  CHECK(Report(svc, *id, 3, 2, true).code() == absl::StatusCode::kInvalidArgument);
  CHECK(Report(svc, *id, 3, 0, true).ok());
  CHECK(*store.LatestCheckpoint("/ckpt/a") == 3);
}

TEST_CASE("A job submitted with resume starts after the latest complete checkpoint") {
  store::MemoryPlanStore store;
  PlannerService svc(&store, ServiceOptions());
  proto::JobSpec spec = Job(10, "/ckpt/b/");
  auto first = Submit(svc, spec);
  REQUIRE(first.ok());
  for (int rank = 0; rank < 2; ++rank) REQUIRE(Report(svc, *first, 5, rank, true).ok());
  CHECK(*store.LatestCheckpoint("/ckpt/b") == 5);  // trailing slash: the same directory

  spec.mutable_checkpoint()->set_resume(true);
  auto second = Submit(svc, spec);
  REQUIRE(second.ok());
  auto status = store.GetJob(*second);
  REQUIRE(status.ok());
  CHECK(status->start_iteration() == 6);
  CHECK(status->iterations_done() == 6);
  CHECK(Report(svc, *second, 5, 0, false).code() == absl::StatusCode::kInvalidArgument);  // before its start

  // Executors get assignments starting there (the first job holds no executors: cancel it).
  proto::CancelJobRequest cancel;
  cancel.set_job_id(*first);
  REQUIRE(svc.Cancel(cancel).ok());
  for (int d = 0; d < 2; ++d) {
    proto::RegisterExecutorRequest reg;
    reg.set_node("n");
    reg.set_device_index(d);
    auto r = svc.Register(reg);
    REQUIRE(r.ok());
    proto::HeartbeatRequest hb;
    hb.set_executor_id(r->executor_id());
    auto beat = svc.Heartbeat(hb);
    REQUIRE(beat.ok());
    CHECK(beat->assignment().job_id() == *second);
    CHECK(beat->assignment().start_iteration() == 6);
  }

  // Planning starts at the start iteration too.
  svc.Start();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (store.GetJob(*second)->plans_ready() < 7 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  svc.Stop();
  CHECK(store.GetJob(*second)->plans_ready() == 7);
  CHECK(*store.IsPlanned(*second, 6));
  CHECK_FALSE(*store.IsPlanned(*second, 0));

  // Nothing left to run: refused in one line naming the field.
  spec.set_iterations(6);
  auto none = Submit(svc, spec);
  CHECK(none.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(none.status().message()), Contains("checkpoint.resume") && Contains("iteration 5"));
  // Resume without a directory is a spec error.
  spec.set_iterations(10);
  spec.mutable_checkpoint()->clear_dir();
  CHECK_THAT(std::string(Submit(svc, spec).status().message()), Contains("checkpoint.dir"));
}

TEST_CASE("A job's cost profile resolves under data_root and must describe the job's model") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = std::string(tmp ? tmp : "/tmp") + "/profile-root-" + std::to_string(::getpid());
  std::filesystem::create_directories(root);
  proto::JobSpec spec = Job(10, "/ckpt/p");
  const int hidden = spec.model().hidden();
  auto profile = [&](int h) {
    return absl::StrCat(R"({"device": "cpu", "model_kind": "gpt", "hidden": )", h, R"(, "layers": [)",
                        R"({"kind": "encoder", "param_mb": 1, "points": [{"mbs": 1, "seq": 8, "fw_ms": 1, "bw_ms": 2}]},)",
                        R"({"kind": "postprocess", "param_mb": 1, "points": [{"mbs": 1, "seq": 8, "fw_ms": 1, "bw_ms": 2}]}]})");
  };
  REQUIRE(WriteFileAtomic(root + "/good.json", profile(hidden)).ok());
  REQUIRE(WriteFileAtomic(root + "/other.json", profile(hidden / 2)).ok());
  store::MemoryPlanStore store;
  ServiceOptions options;
  options.data_root = root;
  PlannerService svc(&store, options);
  spec.set_cost_profile_path("good.json");
  CHECK(Submit(svc, spec).ok());
  spec.set_cost_profile_path("other.json");
  const absl::Status wrong = Submit(svc, spec).status();
  CHECK(wrong.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(wrong.message()),
             Contains("cost_profile_path: " + root + "/other.json profiles hidden " + std::to_string(hidden / 2)));
  spec.set_cost_profile_path("missing.json");
  CHECK_THAT(std::string(Submit(svc, spec).status().message()), Contains("cost_profile_path"));
}

// Registers `n` executors; their first heartbeats take the ranks of the
// pending job, which then runs.
void TakeRanks(PlannerService& svc, int n) {
  for (int d = 0; d < n; ++d) {
    proto::RegisterExecutorRequest reg;
    reg.set_node("n");
    reg.set_device_index(d);
    auto r = svc.Register(reg);
    REQUIRE(r.ok());
    proto::HeartbeatRequest hb;
    hb.set_executor_id(r->executor_id());
    REQUIRE(svc.Heartbeat(hb).ok());
  }
}

absl::Status ReportLost(PlannerService& svc, const std::string& job, int rank, int lost_peer) {
  proto::IterationReport r;
  r.set_job_id(job);
  r.set_iteration(1);
  r.set_rank(rank);
  r.set_error(absl::StrCat("rank ", rank, " iteration 1: recv from rank ", lost_peer, " failed"));
  r.set_lost_peer(lost_peer);
  return svc.ReportIteration(r);
}

proto::JobState::Value State(store::PlanStore& store, const std::string& job) { return store.GetJob(job)->state(); }

TEST_CASE("A failed job names the rank its peers lost, not the bystander that reported first") {
  store::MemoryPlanStore store;
  PlannerService svc(&store, ServiceOptions());
  proto::JobSpec spec = Job(10, "/ckpt/f");
  spec.mutable_parallelism()->set_dp(2);  // ranks 0,1 | 2,3 are the pipelines
  auto id = Submit(svc, spec);
  REQUIRE(id.ok());
  TakeRanks(svc, 4);
  REQUIRE(State(store, *id) == proto::JobState::running);
  // Rank 1 died. Rank 3 lost it and aborted, so rank 2 lost rank 3 and reported first.
  REQUIRE(ReportLost(svc, *id, 2, 3).ok());
  CHECK(State(store, *id) == proto::JobState::running);  // rank 3 may be the cause: wait
  REQUIRE(ReportLost(svc, *id, 3, 1).ok());
  CHECK(State(store, *id) == proto::JobState::running);  // rank 0 has not spoken
  REQUIRE(ReportLost(svc, *id, 0, 1).ok());
  auto st = store.GetJob(*id);
  CHECK(st->state() == proto::JobState::failed);
  CHECK(st->error() == "rank 1 failed (ranks 0, 3 lost it): rank 3 iteration 1: recv from rank 1 failed");
}

TEST_CASE("Failure reports still incomplete after the grace period are judged with what arrived") {
  store::MemoryPlanStore store;
  FakeClock clock;
  ServiceOptions options;
  options.clock = &clock;
  options.heartbeat_timeout = absl::Milliseconds(400);  // checks every 100 ms
  options.failure_grace = absl::Milliseconds(200);
  PlannerService svc(&store, options);
  proto::JobSpec spec = Job(10, "/ckpt/g");
  spec.mutable_parallelism()->set_dp(2);
  auto id = Submit(svc, spec);
  REQUIRE(id.ok());
  TakeRanks(svc, 4);
  REQUIRE(ReportLost(svc, *id, 2, 3).ok());
  svc.Start();
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(State(store, *id) == proto::JobState::running);  // the grace has not passed
  clock.Advance(absl::Milliseconds(250));                 // heartbeats are still fresh
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (State(store, *id) == proto::JobState::running && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  svc.Stop();
  auto st = store.GetJob(*id);
  CHECK(st->state() == proto::JobState::failed);
  CHECK(st->error() == "rank 3 failed (rank 2 lost it): rank 2 iteration 1: recv from rank 3 failed");
}

}  // namespace
}  // namespace dynapipe::planner::service
