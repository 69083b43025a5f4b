// PlannerService over the in-memory store: checkpoint completion from the
// ranks' reports and jobs resumed from the latest complete checkpoint. The
// same over Redis and gRPC: tests/integration/checkpoint_resume_test.cc.
#include "planner/service/planner_service.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/testing/test_specs.h"
#include "planner/testing/timed_report.h"
#include "src/checkpoint/checkpoint.h"
#include "src/data/dataset.h"
#include "src/common/clock.h"
#include "src/common/file_util.h"
#include "src/store/memory_plan_store.h"
#include "src/spec/normalized_for_test.h"

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

// Options whose data root is "/": these tests name files in TEST_TMPDIR.
ServiceOptions AnywhereOptions() {
  ServiceOptions o;
  o.data_root = "/";
  return o;
}

absl::Status Report(PlannerService& svc, const std::string& job, int64_t iteration, int rank, bool checkpoint) {
  proto::IterationReport r;
  r.set_job_id(job);
  r.set_iteration(iteration);
  r.set_rank(rank);
  r.set_checkpoint_written(checkpoint);
  return svc.ReportIteration(r);
}

proto::GetJobRequest Request(const std::string& id) {
  proto::GetJobRequest r;
  r.set_job_id(id);
  return r;
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
  PlannerService svc(&store, AnywhereOptions());
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
  PlannerService svc(&store, AnywhereOptions());
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
  std::vector<std::string> executors;
  for (int d = 0; d < 2; ++d) {
    proto::RegisterExecutorRequest reg;
    reg.set_node("n");
    reg.set_device_index(d);
    auto r = svc.executors().Register(reg);
    REQUIRE(r.ok());
    executors.push_back(r->executor_id());
  }
  // Placed once every executor has heartbeated (a registration alone does
  // not make an executor placeable): each has its seat by its second beat.
  for (int round = 0; round < 2; ++round) {
    for (const std::string& id : executors) {
      proto::HeartbeatRequest hb;
      hb.set_executor_id(id);
      auto beat = svc.executors().Heartbeat(hb);
      REQUIRE(beat.ok());
      if (round == 0) continue;
      CHECK(beat->assignment().job_id() == *second);
      CHECK(beat->assignment().start_iteration() == 6);
    }
    absl::SleepFor(absl::Milliseconds(150));  // past the eager placement interval (100 ms)
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
  proto::JobSpec spec = Job(10, "ckpt/p");
  std::filesystem::copy_file(spec.dataset().path(), root + "/lengths.txt");
  spec.mutable_dataset()->set_path("lengths.txt");
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
             Contains("cost_profile_path: other.json profiles hidden " + std::to_string(hidden / 2)));
  // The same dimensions profiled for another kind of model (a Llama's block costs otherwise).
  spec.set_cost_profile_path("good.json");
  spec.mutable_model()->set_kind(proto::ModelKind::llama);
  CHECK_THAT(std::string(Submit(svc, spec).status().message()),
             Contains("cost_profile_path: good.json profiles a gpt model; the job's is llama"));
  spec.mutable_model()->set_kind(proto::ModelKind::gpt);
  spec.set_cost_profile_path("missing.json");
  CHECK_THAT(std::string(Submit(svc, spec).status().message()), Contains("cost_profile_path"));
}

TEST_CASE("Submit keeps job paths under data_root and never echoes a file's contents") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(tmp ? tmp : "/tmp") + "/confine-" + std::to_string(::getpid());
  const std::string root = base + "/root";
  std::filesystem::create_directories(root + "/ckpt");
  const std::string secret = base + "/secret.txt";
  REQUIRE(WriteFileAtomic(secret, "hunter2 the-password\n").ok());
  std::filesystem::create_symlink(secret, root + "/link.txt");
  REQUIRE(WriteFileAtomic(root + "/notes.txt", "12\nhunter2 is not a length\n").ok());
  store::MemoryPlanStore store;
  ServiceOptions options;
  options.data_root = root;
  PlannerService svc(&store, options);
  proto::JobSpec spec = Job(10, "ckpt/c");
  std::filesystem::copy_file(spec.dataset().path(), root + "/lengths.txt");
  spec.mutable_dataset()->set_path("lengths.txt");
  REQUIRE(Submit(svc, spec).ok());
  auto refused = [&](const std::string& path, const std::string& want) {
    proto::JobSpec bad = spec;
    bad.mutable_dataset()->set_path(path);
    const absl::Status st = Submit(svc, bad).status();
    INFO(path << ": " << st.message());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(st.message()), Contains("dataset.path") && Contains(want));
    CHECK_THAT(std::string(st.message()), !Contains("hunter2") && !Contains("password"));
  };
  refused(secret, "outside --data-root");
  refused("../secret.txt", "..");
  refused("link.txt", "outside --data-root");
  refused("notes.txt", "notes.txt:2");  // the line number, not the line
  refused("/etc/shadow", "outside --data-root");
  // An indexed dataset directory inside the root whose files link out.
  std::filesystem::create_directories(root + "/ds");
  for (const char* f : {"dataset.pbtxt", "index.bin", "tokens.bin"}) {
    REQUIRE(WriteFileAtomic(base + "/" + f, "hunter2").ok());
    std::filesystem::create_symlink(base + "/" + f, root + "/ds/" + f);
  }
  {
    proto::JobSpec linked = spec;
    linked.mutable_dataset()->set_path("ds");
    linked.mutable_dataset()->set_format(proto::DatasetSpec::indexed);
    const absl::Status st = Submit(svc, linked).status();
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(st.message()), Contains("outside --data-root") && !Contains("hunter2"));
  }
  proto::JobSpec ckpt = spec;
  ckpt.mutable_checkpoint()->set_dir(base + "/elsewhere");
  CHECK_THAT(std::string(Submit(svc, ckpt).status().message()), Contains("checkpoint.dir") && Contains("outside"));
  proto::JobSpec profile = spec;
  profile.set_cost_profile_path("../secret.txt");
  CHECK(Submit(svc, profile).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(WriteFileAtomic(root + "/p.json", "{\"hunter2\": 1}").ok());
  profile.set_cost_profile_path("p.json");
  const absl::Status bad_profile = Submit(svc, profile).status();
  CHECK_THAT(std::string(bad_profile.message()), Contains("p.json") && !Contains("hunter2"));
}

TEST_CASE("Resume without a store record starts after the newest complete checkpoint on disk, never over it") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = std::string(tmp ? tmp : "/tmp") + "/resume-disk-" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  auto shard = [&](const std::string& dir, int iteration, int rank) {
    const std::string path = absl::StrFormat("%s/%s/iter-%08d/rank-%05d.ckpt", root, dir, iteration, rank);
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    REQUIRE(WriteFileAtomic(path, "shard").ok());
  };
  shard("run", 3, 0), shard("run", 3, 1);  // complete (2 ranks)
  shard("run", 5, 0);                      // rank 1 never wrote it
  shard("partial", 2, 1);                  // no complete checkpoint at all
  store::MemoryPlanStore store;  // empty: Redis was flushed or replaced
  ServiceOptions options;
  options.data_root = root;
  PlannerService svc(&store, options);
  proto::JobSpec spec = Job(10, "run");
  std::filesystem::copy_file(spec.dataset().path(), root + "/lengths.txt");
  spec.mutable_dataset()->set_path("lengths.txt");

  // Without resume, a run from iteration 0 would overwrite the shards: refused.
  const absl::Status overwrite = Submit(svc, spec).status();
  CHECK(overwrite.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(overwrite.message()), Contains("checkpoint.dir: run already holds checkpoints"));
  CHECK(store.ListJobs()->empty());

  spec.mutable_checkpoint()->set_resume(true);
  auto id = Submit(svc, spec);
  REQUIRE(id.ok());
  CHECK(svc.Get(Request(*id))->start_iteration() == 4);

  spec.mutable_checkpoint()->set_dir("partial");
  const absl::Status partial = Submit(svc, spec).status();
  CHECK(partial.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(partial.message()), Contains("no checkpoint with all 2 ranks' shards"));

  spec.mutable_checkpoint()->set_dir("fresh");  // nothing there: starts at 0
  auto fresh = Submit(svc, spec);
  REQUIRE(fresh.ok());
  CHECK(svc.Get(Request(*fresh))->start_iteration() == 0);

  // An incomplete first checkpoint of this very job (a rank died while
  // writing it) is started over; one of another job layout is not.
  const std::vector<float> values(10, 1.0f);
  auto real_shard = [&](const std::string& dir, uint64_t fingerprint) {
    checkpoint::ShardRef ref;
    ref.iteration = 4;
    ref.rank = 1;
    ref.world = 2;
    ref.job_fingerprint = fingerprint;
    ref.params = {{"w", values}};
    REQUIRE(checkpoint::WriteShard(root + "/" + dir, ref).ok());
  };
  real_shard("own", checkpoint::JobFingerprint(spec::NormalizedForTest(spec)));
  real_shard("other", checkpoint::JobFingerprint(spec::NormalizedForTest(spec)) + 1);
  spec.mutable_checkpoint()->set_dir("own");
  auto own = Submit(svc, spec);
  REQUIRE(own.ok());
  CHECK(svc.Get(Request(*own))->start_iteration() == 0);
  spec.mutable_checkpoint()->set_dir("other");
  const absl::Status other = Submit(svc, spec).status();
  CHECK(other.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(other.message()), Contains("other/iter-00000004/rank-00001.ckpt belongs to another job layout"));
}

double Gauge(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(metrics.substr(at + name.size() + 2));
}

TEST_CASE("Ended jobs release the planning state this process holds") {
  store::MemoryPlanStore store;
  ServiceOptions options = AnywhereOptions();
  options.heartbeat_timeout = absl::Milliseconds(200);  // the background loop runs every 50 ms
  PlannerService svc(&store, options);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto id = Submit(svc, Job(10, absl::StrCat("/ckpt/release-", i)));
    REQUIRE(id.ok());
    ids.push_back(*id);
  }
  svc.Start();
  // The gauge as last read: a job cancelled between the loader's read of
  // its state and the load is loaded once more, until the next sweep (a
  // job read as ended is not loaded: JobRuntimes::Get).
  auto wait_for = [&](double want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    double loaded = Gauge(svc.MetricsText(), "dynapipe_jobs_loaded");
    while (loaded != want && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      loaded = Gauge(svc.MetricsText(), "dynapipe_jobs_loaded");
    }
    return loaded;
  };
  CHECK(wait_for(3) == 3);  // planning ahead loaded every job
  for (const std::string& id : ids) {
    proto::CancelJobRequest c;
    c.set_job_id(id);
    REQUIRE(svc.Cancel(c).ok());
  }
  CHECK(wait_for(0) == 0);
  svc.Stop();
}

TEST_CASE("The cost refit learns from reports and shows in status") {
  store::MemoryPlanStore store;
  PlannerService svc(&store, AnywhereOptions());
  proto::JobSpec spec = Job(10, "/ckpt/refit");
  spec.mutable_cost_refit()->set_mode(proto::CostRefitSpec::on);
  auto id = Submit(svc, spec);
  REQUIRE(id.ok());
  svc.Start();
  for (int64_t i = 0; i < 5; ++i) {
    for (int rank = 0; rank < 2; ++rank) {
      absl::StatusOr<proto::ExecutionPlan> plan = store.GetPlan(*id, i, rank);
      for (const absl::Time deadline = absl::Now() + absl::Seconds(10); !plan.ok() && absl::Now() < deadline;) {
        absl::SleepFor(absl::Milliseconds(20));
        plan = store.GetPlan(*id, i, rank);
      }
      REQUIRE(plan.ok());
      // A machine on which a chunk's forward costs 2 ms and its backward
      // 4 ms whatever the shape: nothing like the H100 the job describes.
      proto::IterationReport r = testing::TimedReport(
          *plan, [](const proto::Instruction& ins) { return ins.has_forward() ? 2 : ins.has_backward() ? 4 : 0.05; },
          1);
      r.set_job_id(*id);
      REQUIRE(svc.ReportIteration(r).ok());
    }
  }
  // Three iterations in, every further one refits.
  CHECK_THAT(svc.StatusJson(), Contains("\"refit\":{\"observed\":5,\"refits\":3,") &&
                                   Contains("\"iteration\":4,\"predicted_ms\":") &&
                                   Contains(",\"explore\":false}"));
  CHECK_THAT(svc.MetricsText(),
             Contains(absl::StrCat("dynapipe_refit_prediction_error{job=\"", *id, "\",plans=\"base\"}")) &&
                 Contains(absl::StrCat("dynapipe_refit_refits_total{job=\"", *id, "\"} 3\n")));
  svc.Stop();
}

TEST_CASE("Submit refuses a 300 MB name before storing anything") {
  store::MemoryPlanStore store;
  PlannerService svc(&store, AnywhereOptions());
  proto::JobSpec spec = Job(10, "/ckpt/n");
  spec.set_name(std::string(300u << 20, 'n'));
  const absl::Status st = Submit(svc, spec).status();
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(st.message()), Contains("name: longer than 256 bytes"));
  CHECK(store.ListJobs()->empty());
}

TEST_CASE("Submit refuses a model whose vocabulary is smaller than the dataset's") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/vocab-" + std::to_string(::getpid());
  proto::DatasetInfo info;
  info.set_vocab(1000);
  info.add_tasks("t");
  auto w = data::DatasetWriter::Create(dir, info);
  REQUIRE(w.ok());
  for (uint32_t i = 0; i < 64; ++i) {
    const std::vector<uint32_t> in = {1, 2, 3, 999}, out = {4, 5};
    REQUIRE((*w)->Add(in, out, 0).ok());
  }
  REQUIRE((*w)->Finish().ok());
  store::MemoryPlanStore store;
  PlannerService svc(&store, AnywhereOptions());
  proto::JobSpec spec = Job(10, "/ckpt/v");
  spec.mutable_dataset()->set_path(dir);
  spec.mutable_dataset()->set_format(proto::DatasetSpec::indexed);
  spec.mutable_batching()->set_global_batch_tokens(64);
  spec.mutable_model()->set_vocab(999);
  const absl::Status st = Submit(svc, spec).status();
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(st.message()), Contains("model.vocab: 999 is smaller than the 1000 token ids"));
  spec.mutable_model()->set_vocab(1000);
  CHECK(Submit(svc, spec).ok());
}

// Sends one heartbeat from each of `ids`; returns what each was assigned.
std::vector<proto::Assignment> Beat(PlannerService& svc, const std::vector<std::string>& ids) {
  std::vector<proto::Assignment> out;
  for (const std::string& id : ids) {
    proto::HeartbeatRequest hb;
    hb.set_executor_id(id);
    auto beat = svc.executors().Heartbeat(hb);
    REQUIRE(beat.ok());
    out.push_back(beat->assignment());
  }
  return out;
}

// Registers `n` executors; once each has heartbeated (which makes it
// placeable), their next heartbeats take the ranks of the pending job
// (placed as a gang), which then runs.
void TakeRanks(PlannerService& svc, int n) {
  std::vector<std::string> ids;
  for (int d = 0; d < n; ++d) {
    proto::RegisterExecutorRequest reg;
    reg.set_node("n");
    reg.set_device_index(d);
    auto r = svc.executors().Register(reg);
    REQUIRE(r.ok());
    ids.push_back(r->executor_id());
  }
  Beat(svc, ids);
  absl::SleepFor(absl::Milliseconds(150));  // past the eager placement interval (100 ms)
  for (const proto::Assignment& a : Beat(svc, ids)) REQUIRE_FALSE(a.job_id().empty());
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
  PlannerService svc(&store, AnywhereOptions());
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

TEST_CASE("Gangs go to executors that checked in recently, not to records of executors that just went quiet") {
  store::MemoryPlanStore store;
  FakeClock clock;
  ServiceOptions options = AnywhereOptions();
  options.clock = &clock;  // heartbeat timeout 10 s, interval 1 s
  PlannerService svc(&store, options);
  auto register_executor = [&](int device) {
    proto::RegisterExecutorRequest reg;
    reg.set_node("n");
    reg.set_device_index(device);
    auto r = svc.executors().Register(reg);
    REQUIRE(r.ok());
    return r->executor_id();
  };
  // Two executors that registered, heartbeated and then died (or were
  // restarted under new ids).
  const std::vector<std::string> quiet = {register_executor(0), register_executor(1)};
  Beat(svc, quiet);
  clock.Advance(absl::Seconds(4));  // still "live" (under the timeout), no longer fresh
  const std::vector<std::string> fresh = {register_executor(0), register_executor(1)};
  Beat(svc, fresh);
  auto id = Submit(svc, Job(10, "/ckpt/fresh"));
  REQUIRE(id.ok());
  absl::SleepFor(absl::Milliseconds(150));  // past the eager placement interval (100 ms)
  for (const proto::Assignment& a : Beat(svc, fresh)) CHECK(a.job_id() == *id);
  for (const std::string& e : quiet) CHECK(store.SeatOf(e)->job.empty());
}

TEST_CASE("A running job whose progress stalls past the progress timeout fails, naming the iteration") {
  store::MemoryPlanStore store;
  ServiceOptions options = AnywhereOptions();
  options.heartbeat_timeout = absl::Milliseconds(1200);  // liveness passes every 300 ms
  options.progress_timeout = absl::Milliseconds(1500);
  PlannerService svc(&store, options);
  auto id = Submit(svc, Job(10, "/ckpt/progress"));
  REQUIRE(id.ok());
  TakeRanks(svc, 2);
  REQUIRE(State(store, *id) == proto::JobState::running);
  // The executors stay alive throughout: only progress is missing.
  std::atomic<bool> done{false};
  std::thread beats([&] {
    while (!done) {
      const auto records = svc.executors().Executors();
      for (size_t i = 0; records.ok() && i < records->size(); ++i) {
        proto::HeartbeatRequest hb;
        hb.set_executor_id((*records)[i].executor_id());
        (void)svc.executors().Heartbeat(hb);
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  svc.Start();
  // Progress keeps it running: each completed iteration restarts the clock.
  for (int64_t it = 0; it < 4; ++it) {
    absl::SleepFor(absl::Milliseconds(700));
    REQUIRE(Report(svc, *id, it, 0, false).ok());
    REQUIRE(Report(svc, *id, it, 1, false).ok());
  }
  CHECK(State(store, *id) == proto::JobState::running);
  // Then rank 1 goes quiet on iteration 4 while its heartbeats still come.
  REQUIRE(Report(svc, *id, 4, 0, false).ok());
  const absl::Time stalled = absl::Now();
  const absl::Time deadline = stalled + absl::Seconds(10);
  while (State(store, *id) == proto::JobState::running && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  const absl::Duration took = absl::Now() - stalled;
  done = true;
  beats.join();
  svc.Stop();
  const auto st = store.GetJob(*id);
  CHECK(st->state() == proto::JobState::failed);
  CHECK_THAT(st->error(), Catch::Matchers::StartsWith("no progress for ") &&
                              Catch::Matchers::EndsWith(": iteration 4 not completed by every rank (--progress-timeout-s)"));
  CHECK(took >= options.progress_timeout - absl::Milliseconds(100));
  CHECK(took < options.progress_timeout + absl::Seconds(2));
}

TEST_CASE("Failure reports still incomplete after the grace period are judged with what arrived") {
  store::MemoryPlanStore store;
  FakeClock clock;
  ServiceOptions options = AnywhereOptions();
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

namespace dynapipe::planner::service {
namespace {

TEST_CASE("Records of executors lost for longer than the TTL are dropped; live ones stay") {
  store::MemoryPlanStore store;
  FakeClock clock;
  ServiceOptions options = AnywhereOptions();
  options.clock = &clock;
  options.heartbeat_timeout = absl::Milliseconds(400);  // the background loop runs every 100 ms
  options.lost_executor_ttl = absl::Seconds(60);
  PlannerService svc(&store, options);
  std::vector<std::string> ids;
  for (int d = 0; d < 2; ++d) {
    proto::RegisterExecutorRequest reg;
    reg.set_node("n");
    reg.set_device_index(d);
    auto r = svc.executors().Register(reg);
    REQUIRE(r.ok());
    ids.push_back(r->executor_id());
  }
  svc.Start();
  auto beat = [&](const std::string& id) {
    proto::HeartbeatRequest hb;
    hb.set_executor_id(id);
    return svc.executors().Heartbeat(hb).status();
  };
  auto wait_until = [&](const std::function<bool(const std::vector<proto::ExecutorRecord>&)>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      auto recs = svc.executors().Executors();
      if (recs.ok() && done(*recs)) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  };
  clock.Advance(absl::Seconds(1));
  REQUIRE(beat(ids[1]).ok());
  CHECK(wait_until([&](const auto& recs) { return recs.size() == 2 && recs[0].lost() != recs[1].lost(); }));
  clock.Advance(absl::Seconds(61));
  REQUIRE(beat(ids[1]).ok());
  CHECK(wait_until([&](const auto& recs) { return recs.size() == 1 && recs[0].executor_id() == ids[1]; }));
  CHECK(beat(ids[0]).code() == absl::StatusCode::kNotFound);  // it would register again
  svc.Stop();
}

}  // namespace
}  // namespace dynapipe::planner::service

namespace dynapipe::planner::service {
namespace {

TEST_CASE("/status lists every active job and only the newest 50 that ended, counting the rest") {
  store::MemoryPlanStore store;
  PlannerService svc(&store, AnywhereOptions());
  std::vector<std::string> ids;
  for (int i = 0; i < 57; ++i) {
    proto::SubmitJobRequest req;
    *req.mutable_spec() = Job(4, "");
    req.mutable_spec()->clear_checkpoint();
    auto r = svc.Submit(req);
    REQUIRE(r.ok());
    ids.push_back(r->job_id());
  }
  for (int i = 0; i < 55; ++i) {  // the last two stay active
    proto::CancelJobRequest c;
    c.set_job_id(ids[i]);
    REQUIRE(svc.Cancel(c).ok());
  }
  const std::string json = svc.StatusJson();
  CHECK_THAT(json, Contains("\"ended_jobs_not_shown\":5"));
  for (int i = 0; i < 5; ++i) CHECK(json.find("\"" + ids[i] + "\"") == std::string::npos);  // the oldest ended
  for (int i = 5; i < 57; ++i) CHECK(json.find("\"" + ids[i] + "\"") != std::string::npos);
}

}  // namespace
}  // namespace dynapipe::planner::service
