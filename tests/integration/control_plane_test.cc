// The planner daemon in-process (real Redis, real gRPC on loopback):
// planning ahead, plan serving, errors, outages, executor loss, watch,
// bootstrap and the status endpoint. Load: control_plane_load_test.cc.
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <regex>
#include <sstream>

#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/message_differencer.h"
#include "planner/cost_model/analytic_cost_model.h"
#include "planner/partition/global_batches.h"
#include "planner/service/planner_server.h"
#include "cli/job_commands.h"
#include "src/data/lengths.h"
#include "src/common/file_util.h"
#include "src/common/proto_io.h"
#include "src/data/dataset.h"
#include "src/data/synth.h"
#include "src/testing/redis_server.h"
#include "tests/integration/control_plane_fixture.h"
#include "src/spec/normalized_for_test.h"

namespace dynapipe::testing {
namespace {

using Catch::Matchers::Contains;
using planner::service::PlannerServer;

TEST_CASE("Submitted jobs are planned ahead and each rank fetches exactly the offline plan") {
  Stack s = StartStack();
  auto client = Client(s.address());
  const proto::JobSpec spec = SmallJob(2, 2, 6, 3);
  auto id = client->Submit(spec);
  REQUIRE(id.ok());
  // Look-ahead 3: iterations 0..2 get planned before any executor shows up, no more.
  REQUIRE(Eventually([&] { return client->Get(*id)->plans_ready() == 2; }));
  absl::SleepFor(absl::Milliseconds(500));
  CHECK(client->Get(*id)->plans_ready() == 2);

  // Offline: the same planner library on the same inputs.
  // As the planner sees the job: normalized (defaults filled in, such as
  // the attention kernel the cost model prices).
  const spec::NormalizedJobSpec normalized = spec::NormalizedForTest(spec);
  auto config = planner::PlannerConfigFromJob(normalized);
  REQUIRE(config.ok());
  config->job_id = *id;
  auto cost = planner::AnalyticCostModel::Create(normalized.proto().model(), spec.cluster().device(), {});
  auto offline = planner::Planner::Create(*config, std::shared_ptr<const planner::LayerCostModel>(std::move(*cost)));
  REQUIRE(offline.ok());
  auto raw = data::ReadLengthsFile(spec.dataset().path());
  std::vector<planner::Sample> samples;
  for (size_t i = 0; i < raw->size(); ++i) samples.push_back(planner::Truncate(i, (*raw)[i], 2048, false));
  const auto batches = planner::FormGlobalBatches(samples, 16384, false);
  for (int64_t it = 0; it < 3; ++it) {
    auto expected = (*offline)->Plan(batches[it], it);
    REQUIRE(expected.ok());
    for (int rank = 0; rank < 4; ++rank) {
      auto plan = client->FetchPlan(*id, it, rank, absl::Seconds(5));
      REQUIRE(plan.ok());
      CHECK(plan->rank() == rank);
      CHECK(google::protobuf::util::MessageDifferencer::Equals(*plan, expected->plans[rank]));
    }
  }
}

TEST_CASE("Bad inputs get clear errors and change nothing") {
  Stack s = StartStack("t0ken");
  auto anon = Client(s.address());
  auto client = Client(s.address(), "t0ken");
  auto id = client->Submit(SmallJob(2, 1, 4, 2));
  REQUIRE(id.ok());

  CHECK(anon->List().status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(Client(s.address(), "wrong")->Get(*id).status().code() == absl::StatusCode::kUnauthenticated);

  proto::JobSpec bad = SmallJob(100, 1, 4, 2);  // more stages than layers
  auto r = client->Submit(bad);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(r.status().message()), Contains("parallelism.pp"));
  bad = SmallJob(2, 1, 0, 2);
  CHECK_THAT(std::string(client->Submit(bad).status().message()), Contains("iterations"));
  bad = SmallJob(2, 1, 4, 2);
  bad.mutable_dataset()->set_path("/nonexistent/lengths.txt");
  CHECK_THAT(std::string(client->Submit(bad).status().message()), Contains("dataset.path"));
  bad = SmallJob(2, 1, 4, 2);
  bad.set_memory_limit_mb(100);  // model state alone does not fit
  CHECK_THAT(std::string(client->Submit(bad).status().message()), Contains("does not fit"));
  CHECK(client->List()->jobs_size() == 1);  // nothing stored by the failures

  CHECK(client->FetchPlan("job-424242", 0, 0, absl::Seconds(1)).status().code() == absl::StatusCode::kNotFound);
  CHECK(client->FetchPlan(*id, 0, 7, absl::Seconds(1)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(client->FetchPlan(*id, 99, 0, absl::Seconds(1)).status().code() == absl::StatusCode::kInvalidArgument);

  // A plan overwritten with garbage in Redis is DATA_LOSS, never served.
  REQUIRE(Eventually([&] { return client->FetchPlan(*id, 0, 1, absl::Seconds(5)).ok(); }));
  store::RedisOptions ro;
  ro.port = s.redis->port();
  store::RedisClient raw(ro);
  REQUIRE(raw.Command({"SET", store::Keys().Plan(*id, 0, 1), "\x08\x01garbage"}).ok());
  auto corrupt = client->FetchPlan(*id, 0, 1, absl::Seconds(1));
  CHECK(corrupt.status().code() == absl::StatusCode::kDataLoss);
  CHECK(client->FetchPlan(*id, 0, 0, absl::Seconds(1)).ok());  // other ranks unaffected

  // The CLI: malformed file and unknown field are one line each, exit 2, no job added.
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp ? tmp : "/tmp";
  REQUIRE(WriteFileAtomic(dir + "/bad1.pbtxt", "name: \"x\"\nmodel { hidden: }\n").ok());
  REQUIRE(WriteFileAtomic(dir + "/bad2.pbtxt", "name: \"x\"\niters: 3\n").ok());
  REQUIRE(WriteFileAtomic(dir + "/token", "t0ken\n").ok());
  REQUIRE(::chmod((dir + "/token").c_str(), 0600) == 0);  // a secret: the CLI refuses it readable by others
  for (const auto& [file, needle] : std::vector<std::pair<std::string, std::string>>{
           {dir + "/bad1.pbtxt", "bad1.pbtxt:2"}, {dir + "/bad2.pbtxt", "\"iters\""}}) {
    std::ostringstream out, err;
    const int rc = cli::RunJobCommand("submit", {file, "--planner", s.address(), "--token-file", dir + "/token"}, out, err);
    const std::string text = err.str();
    CHECK(rc == 2);
    CHECK_THAT(text, Contains(needle));
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  }
  std::ostringstream out, err;
  CHECK(cli::RunJobCommand("status", {"--planner", s.address()}, out, err) == 1);  // no token
  CHECK_THAT(err.str(), Contains("token"));
  CHECK(client->List()->jobs_size() == 1);
}

TEST_CASE("Executors register, get ranks, run the job to success; watch and bootstrap work") {
  Stack s = StartStack();
  auto client = Client(s.address());
  auto id = client->Submit(SmallJob(2, 1, 5, 2));
  REQUIRE(id.ok());
  std::vector<rpc::ExecutorCredential> executors;
  std::vector<std::unique_ptr<rpc::PlannerClient>> as;  // a client per executor, calling as it
  for (int d = 0; d < 2; ++d) {
    proto::RegisterExecutorRequest req;
    req.set_node("node0");
    req.set_device_index(d);
    req.set_backend(proto::Backend::cpu);
    auto r = client->Register(req);
    REQUIRE(r.ok());
    executors.push_back({r->executor_id(), r->executor_secret()});
    as.push_back(Client(s.address()));
    as.back()->SetExecutorCredential(executors.back());
  }
  // The first heartbeats show the executors alive (a registration alone
  // gets no rank); the next ones take the job's ranks.
  std::vector<int> ranks(2, -1);
  for (int round = 0; round < 2; ++round) {
    for (int e = 0; e < 2; ++e) {
      proto::HeartbeatRequest hb;
      hb.set_executor_id(executors[e].executor_id);
      auto r = as[e]->Heartbeat(hb);
      REQUIRE(r.ok());
      if (round == 0) continue;
      CHECK(r->assignment().job_id() == *id);
      ranks[e] = r->assignment().rank();
    }
    absl::SleepFor(absl::Milliseconds(150));  // past the eager placement interval (100 ms)
  }
  CHECK(ranks[0] != ranks[1]);
  CHECK(client->Get(*id)->state() == proto::JobState::running);

  // Bootstrap: a Get issued before the Set waits for it.
  std::thread waiter([&] {
    auto v = as[1]->BootstrapGet(*id, "gloo", absl::Seconds(10));
    CHECK(v.ok());
    if (v.ok()) CHECK(*v == "127.0.0.1:1234");
  });
  absl::SleepFor(absl::Milliseconds(200));
  REQUIRE(as[0]->BootstrapSet(*id, "gloo", "127.0.0.1:1234").ok());
  waiter.join();
  CHECK(as[0]->BootstrapGet(*id, "missing", absl::Milliseconds(300)).status().code() ==
        absl::StatusCode::kDeadlineExceeded);

  std::vector<proto::JobEvent> events;
  std::thread watch([&] {
    auto w = Client(s.address());
    const absl::Status st = w->Watch(*id, [&](const proto::JobEvent& e) {
      events.push_back(e);
      return true;
    });
    CHECK(st.ok());
  });
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<SimulatedRank>> sim;
  for (int e = 0; e < 2; ++e) {
    sim.push_back(RunRank([&] { return s.address(); }, *id, ranks[e], executors[e], 5, absl::Milliseconds(50), &stop));
  }
  for (auto& r : sim) {
    r->thread.join();
    CHECK(r->status.ok());
  }
  watch.join();  // ends by itself when the job succeeds
  CHECK(client->Get(*id)->state() == proto::JobState::succeeded);
  REQUIRE_FALSE(events.empty());
  CHECK(events.back().status().state() == proto::JobState::succeeded);
  CHECK(events.back().status().iterations_done() == 5);
  // Heartbeats after the end tell executors to stop.
  proto::HeartbeatRequest hb;
  hb.set_executor_id(executors[0].executor_id);
  CHECK(as[0]->Heartbeat(hb)->stop());
}

TEST_CASE("Gang scheduling: a job larger than the cluster takes no executor and says why; a later job runs") {
  Stack s = StartStack();
  auto client = Client(s.address());
  auto big = client->Submit(SmallJob(4, 2, 3, 2));  // 8 ranks
  REQUIRE(big.ok());
  std::vector<JoinedExecutor> executors;
  for (int d = 0; d < 2; ++d) executors.push_back(RegisterExecutor(s.address(), "node0", d));
  auto beat_all = [&] {
    for (JoinedExecutor& e : executors) {
      proto::HeartbeatRequest hb;
      hb.set_executor_id(e.credential.executor_id);
      auto r = e.client->Heartbeat(hb);
      REQUIRE(r.ok());
      e.assignment = r->assignment();
    }
  };
  // Heartbeats for longer than a liveness pass: the big job takes nobody.
  CHECK(Eventually(
      [&] {
        beat_all();
        return client->Get(*big)->error() == "waiting for executors: needs 8, 2 registered and live";
      },
      absl::Seconds(10)));
  for (int i = 0; i < 5; ++i) {
    beat_all();
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (const JoinedExecutor& e : executors) CHECK(e.assignment.job_id().empty());
  CHECK(client->Get(*big)->state() == proto::JobState::pending);

  // A job that fits, submitted after it, is placed on both and runs to the end.
  auto small = client->Submit(SmallJob(2, 1, 3, 2));
  REQUIRE(small.ok());
  CHECK(Eventually(
      [&] {
        beat_all();
        return executors[0].assignment.job_id() == *small && executors[1].assignment.job_id() == *small;
      },
      absl::Seconds(10)));
  CHECK(executors[0].assignment.rank() != executors[1].assignment.rank());
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<SimulatedRank>> sim;
  for (const JoinedExecutor& e : executors) {
    sim.push_back(RunRank([&] { return s.address(); }, *small, e.assignment.rank(), e.credential, 3,
                          absl::Milliseconds(20), &stop));
  }
  for (auto& r : sim) {
    r->thread.join();
    CHECK(r->status.ok());
  }
  CHECK(client->Get(*small)->state() == proto::JobState::succeeded);
  // The big job is still waiting, holding nothing.
  const auto waiting = client->Get(*big);
  CHECK(waiting->state() == proto::JobState::pending);
  CHECK(waiting->error().rfind("waiting for executors: needs 8", 0) == 0);
  // Cancelling it leaves the executors free for the next job.
  REQUIRE(client->Cancel(*big).ok());
  auto next = client->Submit(SmallJob(2, 1, 1, 1));
  REQUIRE(next.ok());
  CHECK(Eventually(
      [&] {
        beat_all();
        return executors[0].assignment.job_id() == *next && executors[1].assignment.job_id() == *next;
      },
      absl::Seconds(10)));
}

TEST_CASE("A silent executor fails its job within the heartbeat timeout, naming the rank") {
  Stack s = StartStack("", absl::Milliseconds(800));
  auto client = Client(s.address());
  auto id = client->Submit(SmallJob(2, 1, 50, 2));
  REQUIRE(id.ok());
  std::vector<JoinedExecutor> executors = JoinJob(s.address(), *id, 2);
  const int lost_rank = 1;
  const std::string lost_id = executors[lost_rank].credential.executor_id;
  std::atomic<bool> stop{false};
  std::thread beating([&] {  // rank 0 keeps beating; rank 1 went silent (as if SIGKILLed)
    proto::HeartbeatRequest hb;
    hb.set_executor_id(executors[0].credential.executor_id);
    while (!stop) {
      (void)executors[0].client->Heartbeat(hb);
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  const absl::Time t0 = absl::Now();
  REQUIRE(Eventually([&] { return client->Get(*id)->state() == proto::JobState::failed; }, absl::Seconds(10)));
  CHECK(absl::Now() - t0 < absl::Seconds(5));
  stop = true;
  beating.join();
  const std::string error = client->Get(*id)->error();
  CHECK_THAT(error, Contains("rank " + std::to_string(lost_rank) + " lost") && Contains(lost_id));
}

TEST_CASE("Redis down for seconds: the planner stays up, reports unhealthy and UNAVAILABLE (status: the last known "
          "state), then recovers") {
  Stack s = StartStack("", absl::Seconds(60), /*persistent=*/true);
  auto client = Client(s.address());
  auto id = client->Submit(SmallJob(2, 1, 20, 2));
  REQUIRE(id.ok());
  std::vector<JoinedExecutor> executors = JoinJob(s.address(), *id, 2);
  REQUIRE(Eventually([&] { return client->Get(*id)->plans_ready() == 1; }));
  httplib::Client http("127.0.0.1", s.planner->http_port());
  CHECK(http.Get("/healthz")->status == 200);

  s.redis->Stop();
  rpc::PlannerClient::Options o;
  o.address = s.address();
  o.timeout = absl::Milliseconds(300);  // do not retry through the outage
  auto impatient = std::move(*rpc::PlannerClient::Connect(o));
  // Calls that need Redis are UNAVAILABLE; status answers from what the
  // planner last knew, marked stale.
  CHECK(impatient->GetIterations(*id, 0, 10).status().code() == absl::StatusCode::kUnavailable);
  const auto during = impatient->Get(*id);
  REQUIRE(during.ok());
  CHECK(during->stale_ms() > 0);
  CHECK(during->plans_ready() == 1);
  CHECK(impatient->Get("job-00000000-000099").status().code() == absl::StatusCode::kUnavailable);  // never known
  CHECK(Eventually([&] { return http.Get("/healthz")->status == 503; }, absl::Seconds(5)));
  CHECK_THAT(http.Get("/healthz")->body, Contains("Redis"));
  absl::SleepFor(absl::Seconds(2));

  REQUIRE(s.redis->Restart().ok());
  CHECK(Eventually([&] { return client->Get(*id).ok(); }, absl::Seconds(10)));
  CHECK(Eventually([&] { return http.Get("/healthz")->status == 200; }, absl::Seconds(10)));
  // Planning continues: a rank finishing iteration 0 lets iteration 2 be planned.
  proto::IterationReport rep;
  rep.set_job_id(*id);
  rep.set_rank(0);
  rep.set_iteration(0);
  REQUIRE(executors[0].client->ReportIteration(rep).ok());
  rep.set_rank(1);
  REQUIRE(executors[1].client->ReportIteration(rep).ok());
  CHECK(Eventually([&] { return client->Get(*id)->plans_ready() == 2; }));
  CHECK(client->FetchPlan(*id, 2, 1, absl::Seconds(5)).ok());
}

TEST_CASE("A Redis outage longer than the heartbeat timeout is not counted against live executors") {
  Stack s = StartStack("", absl::Milliseconds(1500), /*persistent=*/true);
  auto client = Client(s.address());
  auto id = client->Submit(SmallJob(2, 1, 20, 2));
  REQUIRE(id.ok());
  std::vector<JoinedExecutor> executors = JoinJob(s.address(), *id, 2);
  std::atomic<bool> beating{true};
  std::thread beats([&] {
    while (beating) {
      for (JoinedExecutor& e : executors) {
        proto::HeartbeatRequest hb;
        hb.set_executor_id(e.credential.executor_id);
        (void)e.client->Heartbeat(hb);  // fails while Redis is down, as a real executor's would
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  absl::SleepFor(absl::Milliseconds(500));
  s.redis->Stop();
  absl::SleepFor(absl::Seconds(3));  // twice the heartbeat timeout
  REQUIRE(s.redis->Restart().ok());
  REQUIRE(Eventually([&] { return client->Get(*id).ok(); }, absl::Seconds(10)));
  absl::SleepFor(absl::Seconds(1));  // liveness passes after the outage
  auto st = client->Get(*id);
  INFO(st->error());
  CHECK(st->state() == proto::JobState::running);
  // A real silence is still caught: heartbeats stop, the job fails naming a rank.
  beating = false;
  beats.join();
  CHECK(Eventually([&] { return client->Get(*id)->state() == proto::JobState::failed; }, absl::Seconds(10)));
  CHECK_THAT(client->Get(*id)->error(), Contains("missed heartbeats"));
}

TEST_CASE("A FetchPlan waiting on a job that gets cancelled ends at once; so do waits at shutdown") {
  Stack s = StartStack();
  auto client = Client(s.address());
  auto id = client->Submit(SmallJob(2, 1, 20, 2));
  REQUIRE(id.ok());
  // Iteration 10 is far beyond the look-ahead: the call waits.
  absl::StatusOr<proto::ExecutionPlan> waited;
  absl::Duration took;
  std::thread fetch([&] {
    const absl::Time t0 = absl::Now();
    waited = client->FetchPlan(*id, 10, 0, absl::Seconds(30));
    took = absl::Now() - t0;
  });
  absl::SleepFor(absl::Milliseconds(300));
  REQUIRE(client->Cancel(*id).ok());
  fetch.join();
  CHECK(waited.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(took < absl::Seconds(5));
  CHECK(client->Cancel(*id).code() == absl::StatusCode::kFailedPrecondition);  // already ended

  auto id2 = client->Submit(SmallJob(2, 1, 20, 2));
  REQUIRE(id2.ok());
  std::thread fetch2([&] { waited = client->FetchPlan(*id2, 10, 0, absl::Seconds(3)); });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time t0 = absl::Now();
  s.planner->Shutdown();  // must not hang on the waiting call
  CHECK(absl::Now() - t0 < absl::Seconds(5));
  fetch2.join();
  CHECK_FALSE(waited.ok());
}

TEST_CASE("Jobs on an indexed dataset are planned from the dataset's own lengths") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/indexed-" + std::to_string(::getpid());
  auto raw = data::ReadLengthsFile(RunfilesRoot() + "/tests/data/flan-like-lengths.txt");
  REQUIRE(raw.ok());
  raw->resize(400);
  data::SynthOptions so;
  auto w = data::DatasetWriter::Create(dir, data::SynthInfo(so));
  REQUIRE(w.ok());
  REQUIRE(data::Synthesize(*raw, so, w->get()).ok());
  REQUIRE((*w)->Finish().ok());

  Stack s = StartStack();
  auto client = Client(s.address());
  proto::JobSpec spec = SmallJob(2, 1, 3, 2);
  spec.mutable_dataset()->set_path(dir);
  spec.mutable_dataset()->set_format(proto::DatasetSpec::indexed);
  auto id = client->Submit(spec);
  REQUIRE(id.ok());
  auto plan = client->FetchPlan(*id, 0, 0, absl::Seconds(10));
  REQUIRE(plan.ok());
  auto dataset = data::Dataset::Open(dir);
  REQUIRE(dataset.ok());
  int64_t samples = 0;
  for (const auto& mb : plan->micro_batches()) {
    for (const auto& smp : mb.samples()) {
      REQUIRE(smp.id() < static_cast<int64_t>((*dataset)->size()));
      const auto view = (*dataset)->sample(smp.id());
      CHECK(smp.input_len() == static_cast<int>(view.input.size() + view.target.size()));  // decoder-only: one sequence
      ++samples;
    }
  }
  CHECK(samples > 10);
  spec.mutable_dataset()->set_path(dir + "/missing");
  CHECK_THAT(std::string(client->Submit(spec).status().message()), Contains("dataset.path"));
}

}  // namespace
}  // namespace dynapipe::testing
