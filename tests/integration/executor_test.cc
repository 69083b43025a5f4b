// The executor daemon end to end: real Redis, the planner's gRPC services and
// dynapipe-executor processes training a tiny GPT over Gloo on loopback.
// Covers a 2 x 2 run with checkpoints, bit-identical resume, and a SIGKILLed
// executor (the job fails naming the lost rank, nobody hangs, a resubmitted
// job resumes from the last complete checkpoint).
#include <signal.h>
#include <unistd.h>

#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "src/checkpoint/checkpoint.h"
#include "src/safetensors/weight_set.h"
#include "runtime/backend/backend.h"
#include "src/data/synth.h"
#include "runtime/executor/executor.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/integration/training_fixture.h"

namespace dynapipe::testing {
namespace {

TEST_CASE("executors train 2 x 2, checkpoint, and resume bit-identically; ZeRO-1 too, with the same bits",
          "[executor][integration]") {
  Stack stack = StartStack("", absl::Seconds(5));
  auto client = Client(stack.address());
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(stack.address(), d));
  for (const bool zero1 : {false, true}) {
    INFO("zero1 " << zero1);
    auto job = [&](int iterations, const std::string& dir) {
      proto::JobSpec spec = TrainJob(iterations, dir, 4);
      spec.mutable_optimizer()->set_zero1(zero1);
      spec.mutable_parallelism()->set_grad_bucket_mb(0.001);  // several buckets per stage
      return spec;
    };
    const std::string tag = zero1 ? "-zero1" : "";
    // Uninterrupted: 10 iterations, checkpoints after 4, 8 and the last.
    const std::string full = TmpDir() + "/ckpt-full" + tag;
    auto a = client->Submit(job(10, full));
    REQUIRE(a.ok());
    const proto::JobStatus sa = WaitEnded(client.get(), *a, absl::Seconds(120));
    INFO(sa.error());
    REQUIRE(sa.state() == proto::JobState::succeeded);
    CHECK(sa.last_loss() > 0);
    CHECK(checkpoint::LatestCompleteOnDisk(full, 4).value_or(-1) == 9);

    // Interrupted: stop after iteration 7 (checkpoint 7), then resume to 10.
    const std::string part = TmpDir() + "/ckpt-part" + tag;
    auto b = client->Submit(job(8, part));
    REQUIRE(b.ok());
    REQUIRE(WaitEnded(client.get(), *b, absl::Seconds(120)).state() == proto::JobState::succeeded);
    proto::JobSpec resume = job(10, part);
    resume.mutable_checkpoint()->set_resume(true);
    auto c = client->Submit(resume);
    REQUIRE(c.ok());
    const proto::JobStatus sc = WaitEnded(client.get(), *c, absl::Seconds(120));
    INFO(sc.error());
    REQUIRE(sc.state() == proto::JobState::succeeded);
    CHECK(sc.start_iteration() == 8);
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(Params(part, 9, r) == Params(full, 9, r));  // bit-identical to the uninterrupted run
      // The sharded optimizer trains exactly as the whole one (Params holds
      // the weights, then the first moments, which ZeRO-1 keeps a shard of).
      auto weights = [](std::vector<float> v) {
        v.resize(v.size() / 2);
        return v;
      };
      if (zero1) CHECK(weights(Params(full, 9, r)) == weights(Params(TmpDir() + "/ckpt-full", 9, r)));
    }
    CHECK(sc.last_loss() == sa.last_loss());
  }
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

TEST_CASE("a planner restarted mid-job (SIGTERM, 3 s away) is ridden through: the job ends bit-identically",
          "[executor][integration]") {
  const std::vector<std::string> flags = {"--heartbeat_timeout_ms=5000"};
  ProcessCluster cluster = StartProcessCluster(flags);
  const std::string& address = cluster.address;
  rpc::PlannerClient* client = cluster.client.get();

  const std::string quiet = TmpDir() + "/ckpt-ride-quiet", restarted = TmpDir() + "/ckpt-ride-restarted";
  auto a = client->Submit(TrainJob(12, quiet, 12));
  REQUIRE(a.ok());
  const proto::JobStatus sa = WaitEnded(client, *a, absl::Seconds(120));
  INFO(sa.error());
  REQUIRE(sa.state() == proto::JobState::succeeded);

  auto b = client->Submit(TrainJob(12, restarted, 12));
  REQUIRE(b.ok());
  REQUIRE(Eventually([&] { return client->Get(*b).ok() && client->Get(*b)->iterations_done() >= 3; },
                     absl::Seconds(120)));
  // As `systemctl restart` does: SIGTERM, wait for the exit, start again on the same address.
  cluster.planner->Signal(SIGTERM);
  REQUIRE(cluster.planner->Exited(absl::Seconds(15)));
  absl::SleepFor(absl::Seconds(3));
  std::vector<std::string> again = flags;
  again.push_back("--listen=" + address);
  auto again_planner = PlannerProcess::Start(cluster.redis->port(), again);
  REQUIRE(again_planner.ok());
  cluster.planner = std::move(*again_planner);
  const proto::JobStatus sb = WaitEnded(client, *b, absl::Seconds(120));
  INFO(sb.error());
  REQUIRE(sb.state() == proto::JobState::succeeded);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(Params(restarted, 11, r) == Params(quiet, 11, r));
  }
  CHECK(sb.last_loss() == sa.last_loss());
  for (auto& e : cluster.executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

TEST_CASE("a second planner sharing Redis takes over from a SIGKILLed one; the job ends bit-identically",
          "[executor][integration]") {
  auto redis = RedisServer::Start(absl::Seconds(10), /*persistent=*/true);
  REQUIRE(redis.ok());
  const std::vector<std::string> flags = {"--heartbeat_timeout_ms=5000", "--lease_ttl_ms=3000"};
  auto first = PlannerProcess::Start((*redis)->port(), flags);
  auto second = PlannerProcess::Start((*redis)->port(), flags);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  // Executors and the client name both: the first that answers is used.
  const std::string both = (*first)->address() + "," + (*second)->address();
  auto client = Client(both);
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(both, d));

  const std::string quiet = TmpDir() + "/ckpt-takeover-quiet", taken = TmpDir() + "/ckpt-takeover";
  for (const std::string& dir : {quiet, taken}) std::filesystem::remove_all(dir);  // a rerun outside Bazel
  auto a = client->Submit(TrainJob(40, quiet, 40));
  INFO(a.status());
  REQUIRE(a.ok());
  const proto::JobStatus sa = WaitEnded(client.get(), *a, absl::Seconds(120));
  INFO(sa.error());
  REQUIRE(sa.state() == proto::JobState::succeeded);

  auto b = client->Submit(TrainJob(40, taken, 40));
  REQUIRE(b.ok());
  REQUIRE(Eventually([&] { return client->Get(*b).ok() && client->Get(*b)->iterations_done() >= 3; },
                     absl::Seconds(120)));
  const int64_t killed_at = client->Get(*b)->iterations_done();
  (*first)->Signal(SIGKILL);
  REQUIRE((*first)->Exited(absl::Seconds(5)));
  const proto::JobStatus sb = WaitEnded(client.get(), *b, absl::Seconds(120));
  INFO(sb.error());
  REQUIRE(sb.state() == proto::JobState::succeeded);
  CHECK(killed_at < 40 - 4);  // the survivor planned iterations beyond the dead one's lookahead
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(Params(taken, 39, r) == Params(quiet, 39, r));
  }
  CHECK(sb.last_loss() == sa.last_loss());
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

TEST_CASE("Redis restarted empty: the loss is reported, ids are not reused, a resume continues from disk "
          "bit-identically",
          "[executor][integration]") {
  Stack stack = StartStack("", absl::Seconds(5));  // no append-only file: a restart loses everything
  auto client = Client(stack.address());
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(stack.address(), d));
  const std::string quiet = TmpDir() + "/ckpt-wipe-quiet", wiped = TmpDir() + "/ckpt-wiped";
  for (const std::string& dir : {quiet, wiped}) std::filesystem::remove_all(dir);
  const int iterations = 200;
  auto a = client->Submit(TrainJob(iterations, quiet, 5));
  REQUIRE(a.ok());
  const proto::JobStatus sa = WaitEnded(client.get(), *a, absl::Seconds(180));
  INFO(sa.error());
  REQUIRE(sa.state() == proto::JobState::succeeded);
  CHECK(stack.planner->service().StatusJson().find("\"store_data_lost\":0") != std::string::npos);

  proto::JobSpec spec = TrainJob(iterations, wiped, 5);
  auto b = client->Submit(spec);
  REQUIRE(b.ok());
  REQUIRE(Eventually([&] { return checkpoint::LatestCompleteOnDisk(wiped, 4).value_or(-1) >= 9; },
                     absl::Seconds(60)));
  stack.redis->Stop();
  REQUIRE(stack.redis->Restart().ok());
  // The planner says so; the job is gone with the data.
  CHECK(Eventually([&] { return stack.planner->service().StatusJson().find("\"store_data_lost\":1") != std::string::npos; },
                   absl::Seconds(10)));
  CHECK(client->Get(*b).status().code() == absl::StatusCode::kNotFound);
  // Resubmitted with resume: a new id; it continues after the newest complete
  // checkpoint on disk and ends where the quiet run ended.
  spec.mutable_checkpoint()->set_resume(true);
  auto again = client->Submit(spec);
  REQUIRE(again.ok());
  CHECK(*again != *b);
  CHECK(*again != *a);
  const proto::JobStatus sb = WaitEnded(client.get(), *again, absl::Seconds(180));
  INFO(sb.error());
  REQUIRE(sb.state() == proto::JobState::succeeded);
  CHECK(sb.start_iteration() >= 10);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(Params(wiped, iterations - 1, r) == Params(quiet, iterations - 1, r));
  }
  CHECK(sb.last_loss() == sa.last_loss());
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

TEST_CASE("a SIGKILLed executor fails the job naming its rank; the others stop; a resubmitted job resumes",
          "[executor][integration]") {
  const absl::Duration heartbeat_timeout = absl::Seconds(3);
  Stack stack = StartStack("", heartbeat_timeout);
  auto client = Client(stack.address());
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(stack.address(), d));
  const std::string dir = TmpDir() + "/ckpt-fault";
  auto job = client->Submit(TrainJob(400, dir, 3));
  REQUIRE(job.ok());
  // Let it pass a checkpoint, then kill the executor holding rank 1.
  REQUIRE(Eventually([&] { return checkpoint::LatestCompleteOnDisk(dir, 4).value_or(-1) >= 2; },
                     absl::Seconds(60)));
  std::string victim;
  auto list = client->Executors();
  REQUIRE(list.ok());
  for (const auto& e : list->executors()) {
    if (e.assignment().job_id() == *job && e.assignment().rank() == 1) victim = e.executor_id();
  }
  REQUIRE(!victim.empty());
  int device = -1;
  for (const auto& e : list->executors()) {
    if (e.executor_id() == victim) device = e.info().device_index();
  }
  REQUIRE(device >= 0);
  const absl::Time killed = absl::Now();
  executors[device]->Signal(SIGKILL);
  REQUIRE(executors[device]->Exited(absl::Seconds(10)));
  const proto::JobStatus st = WaitEnded(client.get(), *job, heartbeat_timeout + absl::Seconds(5));
  const absl::Duration took = absl::Now() - killed;
  CHECK(st.state() == proto::JobState::failed);
  CHECK(took <= heartbeat_timeout + absl::Seconds(2));
  INFO(st.error());
  // Named as the cause ("rank 1 failed (...)" or "rank 1 lost: ..."), not a
  // bystander that lost a rank which aborted on losing rank 1.
  CHECK(st.error().rfind("rank 1 ", 0) == 0);
  // The survivors notice and go idle (no hang on the dead peer).
  CHECK(Eventually(
      [&] {
        auto l = client->Executors();
        if (!l.ok()) return false;
        for (const auto& e : l->executors()) {
          if (e.executor_id() != victim && !e.lost() && !e.assignment().job_id().empty()) return false;
        }
        return true;
      },
      absl::Seconds(20)));
  // A replacement executor, a resubmitted job: it resumes after the last complete checkpoint.
  auto latest = checkpoint::LatestCompleteOnDisk(dir, 4);
  REQUIRE(latest.ok());
  REQUIRE(*latest >= 2);
  executors[device] = StartExecutor(stack.address(), device);
  proto::JobSpec again = TrainJob(*latest + 4, dir, 3);
  again.mutable_checkpoint()->set_resume(true);
  auto job2 = client->Submit(again);
  REQUIRE(job2.ok());
  const proto::JobStatus s2 = WaitEnded(client.get(), *job2, absl::Seconds(120));
  INFO(s2.error());
  CHECK(s2.state() == proto::JobState::succeeded);
  // Redis may know one checkpoint less than the disk shows (a shard written,
  // its report lost with the process), never more.
  CHECK(s2.start_iteration() >= 3);
  CHECK(s2.start_iteration() <= *latest + 1);
  CHECK(s2.start_iteration() % 3 == 0);
}

TEST_CASE("a T5 job trains 2 x 2 through the daemons; an executor SIGKILLed after a checkpoint, the resumed job "
          "ends with the uninterrupted run's bits",
          "[executor][integration]") {
  const absl::Duration heartbeat_timeout = absl::Seconds(3);
  Stack stack = StartStack("", heartbeat_timeout);
  auto client = Client(stack.address());
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(stack.address(), d));
  // 2 encoder and 2 decoder layers on 2 stages x 2 groups; the learning rate
  // schedule does not depend on the iteration count (TrainJob).
  auto t5 = [](int iterations, const std::string& dir) { return T5TrainJob(iterations, dir, 3); };
  constexpr int kIterations = 400;
  const std::string full = TmpDir() + "/t5-full";
  auto a = client->Submit(t5(kIterations, full));
  REQUIRE(a.ok());
  const proto::JobStatus sa = WaitEnded(client.get(), *a, absl::Seconds(180));
  INFO(sa.error());
  REQUIRE(sa.state() == proto::JobState::succeeded);

  const std::string part = TmpDir() + "/t5-part";
  auto b = client->Submit(t5(kIterations, part));
  REQUIRE(b.ok());
  REQUIRE(Eventually([&] { return checkpoint::LatestCompleteOnDisk(part, 4).value_or(-1) >= 2; },
                     absl::Seconds(60)));
  auto list = client->Executors();
  REQUIRE(list.ok());
  int device = -1;
  for (const auto& e : list->executors()) {
    if (e.assignment().job_id() == *b && e.assignment().rank() == 3) device = e.info().device_index();
  }
  REQUIRE(device >= 0);
  executors[device]->Signal(SIGKILL);
  REQUIRE(executors[device]->Exited(absl::Seconds(10)));
  const proto::JobStatus sb = WaitEnded(client.get(), *b, heartbeat_timeout + absl::Seconds(5));
  INFO(sb.error());
  REQUIRE(sb.state() == proto::JobState::failed);  // killed before its end (400 iterations take seconds)

  executors[device] = StartExecutor(stack.address(), device);
  proto::JobSpec resume = t5(kIterations, part);
  resume.mutable_checkpoint()->set_resume(true);
  auto c = client->Submit(resume);
  REQUIRE(c.ok());
  const proto::JobStatus sc = WaitEnded(client.get(), *c, absl::Seconds(180));
  INFO(sc.error());
  REQUIRE(sc.state() == proto::JobState::succeeded);
  CHECK(sc.start_iteration() >= 3);
  CHECK(sc.start_iteration() < kIterations);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(Params(part, kIterations - 1, r) == Params(full, kIterations - 1, r));
  }
  CHECK(sc.last_loss() == sa.last_loss());
  CHECK(sa.last_loss() > 0);
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

// Runs a shell command, collecting its output; its wait status.
int RunCapturing(const std::string& cmd, std::string* out) {
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) out->append(buf, n);
  return ::pclose(pipe);
}

// Trains job `a` (2 x 2, checkpoints), exports it with `dynapipe export`
// and through its own export_dir, and starts another job from the export
// through the daemons (model.init_from): every rank holds the trained
// weights. `tag` names the files.
void ExportedModelStartsAJob(proto::JobSpec a, const std::string& tag) {
  Stack stack = StartStack();
  auto client = Client(stack.address());
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(stack.address(), d));
  constexpr int kIterations = 12;
  const std::string trained = TmpDir() + "/" + tag + "-trained";
  const proto::JobSpec spec = a;
  a.set_iterations(kIterations);
  a.mutable_checkpoint()->set_dir(trained);
  a.mutable_checkpoint()->set_interval(4);
  a.set_export_dir(TmpDir() + "/" + tag + "-end-export");  // written by the job itself at its end
  auto ja = client->Submit(a);
  REQUIRE(ja.ok());
  const proto::JobStatus sa = WaitEnded(client.get(), *ja, absl::Seconds(120));
  INFO(sa.error());
  REQUIRE(sa.state() == proto::JobState::succeeded);

  // Out through the client tool, as a user would, while nothing runs.
  std::string text;
  REQUIRE(google::protobuf::TextFormat::PrintToString(a, &text));
  const std::string job_file = TmpDir() + "/" + tag + "-trained.pbtxt";
  std::ofstream(job_file) << text;
  const std::string hf = TmpDir() + "/" + tag + "-trained-hf";
  std::string out;
  const int rc = RunCapturing(absl::StrCat(RunfilesRoot(), "/cli/dynapipe export ", job_file, " --out ", hf, " 2>&1"),
                              &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("exported iteration 11") != std::string::npos);
  // The job's own export at its end holds the same model as the export of its
  // last checkpoint.
  {
    auto end = safetensors::WeightSet::Open(a.export_dir());
    auto cli = safetensors::WeightSet::Open(hf);
    REQUIRE(end.ok());
    REQUIRE(cli.ok());
    CHECK(end->size() == cli->size());
    CHECK(end->config_json() == cli->config_json());
    auto reader = safetensors::Reader::Open(hf + "/model.safetensors");
    REQUIRE(reader.ok());
    for (const safetensors::TensorInfo& t : reader->tensors()) {
      INFO(t.name);
      auto x = end->ReadF32(t.name);
      auto y = cli->ReadF32(t.name);
      REQUIRE(x.ok());
      CHECK(*x == *y);
    }
  }

  // In again: one step at the smallest learning rate a job takes keeps the
  // trained weights, on every rank of the 2 x 2 pipeline.
  const std::string started = TmpDir() + "/" + tag + "-from-hf";
  proto::JobSpec b = spec;
  b.set_iterations(1);
  b.mutable_checkpoint()->set_dir(started);
  b.mutable_checkpoint()->set_interval(1);
  b.set_name(tag + "-from-hf");
  b.mutable_model()->set_init_from(hf);
  b.mutable_optimizer()->set_lr(1e-12);
  auto jb = client->Submit(b);
  REQUIRE(jb.ok());
  const proto::JobStatus sb = WaitEnded(client.get(), *jb, absl::Seconds(60));
  INFO(sb.error());
  REQUIRE(sb.state() == proto::JobState::succeeded);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    auto want = checkpoint::ReadShard(trained, kIterations - 1, r);
    auto got = checkpoint::ReadShard(started, 0, r);
    REQUIRE(want.ok());
    REQUIRE(got.ok());
    REQUIRE(got->params.size() == want->params.size());
    for (size_t t = 0; t < got->params.size(); ++t) {
      INFO(got->params[t].name);
      REQUIRE(got->params[t].name == want->params[t].name);
      float worst = 0;
      for (size_t i = 0; i < got->params[t].data.size(); ++i) {
        worst = std::max(worst, std::abs(got->params[t].data[i] - want->params[t].data[i]));
      }
      CHECK(worst <= 1e-11f);
    }
  }
  // Not vacuous: twelve steps at 3e-3 moved the trained weights far from the
  // seed's that job b would have started from.
  const std::vector<float> seed = Params(trained, 3, 0), last = Params(trained, kIterations - 1, 0);
  float drift = 0;
  for (size_t i = 0; i < seed.size(); ++i) drift = std::max(drift, std::abs(seed[i] - last[i]));
  CHECK(drift > 1e-4f);

  proto::JobSpec missing = b;
  missing.mutable_model()->set_init_from(TmpDir() + "/no-such-model");
  auto refused = client->Submit(missing);
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()).find("model.init_from: ") != std::string::npos);
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

TEST_CASE("a T5 job exported with `dynapipe export` starts another job through the daemons (model.init_from) "
          "from its trained weights; a missing init_from is refused at Submit",
          "[executor][integration]") {
  ExportedModelStartsAJob(T5TrainJob(1, "", 0), "t5");
}

TEST_CASE("a GPT-2-style job exported with `dynapipe export` starts another job through the daemons from its "
          "trained weights",
          "[executor][integration]") {
  ExportedModelStartsAJob(TrainJob(1, "", 0), "gpt2");
}

TEST_CASE("a Llama-style job (2 kv heads for 4, untied head) exported with `dynapipe export` starts another job "
          "through the daemons from its trained weights",
          "[executor][integration]") {
  proto::JobSpec llama = TrainJob(1, "", 0);
  llama.set_name("llama-itest");
  llama.mutable_model()->set_kind(proto::ModelKind::llama);
  llama.mutable_model()->set_tie_embeddings(false);
  llama.mutable_model()->set_kv_heads(2);
  ExportedModelStartsAJob(llama, "llama");
}

TEST_CASE("an abort that lands after a job's communicator is gone touches nothing (job end vs heartbeat)",
          "[executor][integration]") {
  // In process, so the abort can be placed in the window exactly: after the
  // job's communicator was destroyed, before the executor forgot the job.
  // It once reached the freed communicator (ASan: heap-use-after-free).
  Stack s = StartStack();
  auto client = Client(s.address());
  proto::JobSpec spec = TrainJob(2, "", 0);
  spec.mutable_parallelism()->set_pp(1);
  spec.mutable_parallelism()->set_dp(1);
  spec.clear_checkpoint();
  auto id = client->Submit(spec);
  REQUIRE(id.ok());
  runtime::executor::ExecutorOptions o;
  o.planner.address = s.address();
  o.data_root = "/";
  o.comm_timeout = absl::Seconds(20);
  runtime::executor::Executor* self = nullptr;
  std::atomic<int> aborts{0};
  o.after_job_for_test = [&] {
    ++aborts;
    self->Shutdown();  // what a heartbeat saying "stop" or a signal does: abort the running job
  };
  auto backend = runtime::CreateBackend({.kind = proto::Backend::cpu});
  REQUIRE(backend.ok());
  runtime::executor::Executor executor(o, std::move(*backend));
  self = &executor;
  absl::Status run;
  std::thread runner([&] { run = executor.Run(); });
  const proto::JobStatus end = WaitEnded(client.get(), *id, absl::Seconds(60));
  CHECK(end.state() == proto::JobState::succeeded);
  CHECK(Eventually([&] { return aborts.load() == 1; }));
  runner.join();  // Shutdown from the hook ends Run
  CHECK(run.ok());
}

TEST_CASE("dynapipe-executor --backend cuda without a GPU stops at start with one line saying so") {
  // timeout: where a GPU and a CUDA build exist the executor starts instead
  // (and would wait for its planner); that case belongs to deploy/gpu_checks.sh.
  const std::string cmd = "timeout 20 " + RunfilesRoot() +
                          "/runtime/executor/dynapipe-executor --backend=cuda --planner=127.0.0.1:1 "
                          "--http_port=-1 2>&1";
  std::string out;
  const int status = RunCapturing(cmd, &out);
  INFO(out);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 124) {
    SUCCEED("a CUDA device is visible here: the executor started");
    return;
  }
  CHECK(WEXITSTATUS(status) == 2);
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  CHECK(out.find("--backend cuda: ") != std::string::npos);
  CHECK((out.find("no CUDA device") != std::string::npos || out.find("no CUDA backend") != std::string::npos));
  CHECK(out.find("registered") == std::string::npos);  // it never got as far as the planner
}

TEST_CASE("dynapipe-executor refuses an unknown backend or communicator naming the flag") {
  for (const char* flags : {"--backend=tpu", "--comm=mpi", "--backend=cpu --comm=nccl"}) {
    const std::string cmd = "timeout 20 " + RunfilesRoot() + "/runtime/executor/dynapipe-executor " + flags +
                            " --planner=127.0.0.1:1 --http_port=-1 2>&1";
    std::string out;
    const int status = RunCapturing(cmd, &out);
    INFO(flags << ": " << out);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    CHECK((out.find("--backend") != std::string::npos || out.find("--comm") != std::string::npos));
  }
}

}  // namespace
}  // namespace dynapipe::testing
