// What users and their schedulers see while the job rides through planner
// and Redis outages: `dynapipe watch` keeps going and ends 0 with the job's
// final line; with Redis frozen, status calls answer at once from the
// planner's last known state, saying so; a job lost with an emptied Redis is
// reported as such, with how to resume it.
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/checkpoint/checkpoint.h"
#include "src/testing/redis_server.h"
#include "src/testing/shell.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/integration/training_fixture.h"

namespace dynapipe::testing {
namespace {

std::string Cli() { return RunfilesRoot() + "/cli/dynapipe"; }

// `dynapipe ARGS` as a child process, stdout and stderr into `out`.
std::unique_ptr<ChildProcess> StartCli(const std::string& args, const std::string& out) {
  return std::make_unique<ChildProcess>(
      std::vector<std::string>{"/bin/sh", "-c", absl::StrCat("exec ", Cli(), " ", args, " >", out, " 2>&1")});
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return absl::StrSplit(ss.str(), '\n', absl::SkipEmpty());
}

TEST_CASE("watch rides through a planner SIGKILL and a Redis restart; it ends 0 on the job's final line, no line twice",
          "[integration]") {
  const std::vector<std::string> flags = {"--heartbeat_timeout_ms=5000"};
  ProcessCluster cluster = StartProcessCluster(flags);
  const std::string& address = cluster.address;
  rpc::PlannerClient* client = cluster.client.get();
  const int kIterations = 80;
  auto job = client->Submit(TrainJob(kIterations, "", 0));
  REQUIRE(job.ok());
  const std::string out = TmpDir() + "/watch-ride.out";
  auto watch = StartCli(absl::StrCat("watch ", *job, " --planner ", address), out);
  auto done = [&](int64_t n) {
    return Eventually([&] { return client->Get(*job).ok() && client->Get(*job)->iterations_done() >= n; },
                      absl::Seconds(120));
  };
  REQUIRE(done(3));

  // The planner dies and comes back on its address 3 s later.
  cluster.planner->Signal(SIGKILL);
  REQUIRE(cluster.planner->Exited(absl::Seconds(5)));
  absl::SleepFor(absl::Seconds(3));
  CHECK_FALSE(watch->Exited(absl::ZeroDuration()));
  std::vector<std::string> again = flags;
  again.push_back("--listen=" + address);
  auto again_planner = PlannerProcess::Start(cluster.redis->port(), again);
  REQUIRE(again_planner.ok());
  cluster.planner = std::move(*again_planner);
  const int64_t after_planner = client->Get(*job).ok() ? client->Get(*job)->iterations_done() : 0;
  REQUIRE(done(after_planner + 3));

  // Redis is killed and restarted from its append-only file 2 s later.
  ::kill(cluster.redis->pid(), SIGKILL);
  absl::SleepFor(absl::Seconds(2));
  CHECK_FALSE(watch->Exited(absl::ZeroDuration()));
  REQUIRE(cluster.redis->Restart().ok());

  const proto::JobStatus end = WaitEnded(client, *job, absl::Seconds(180));
  INFO(end.error());
  REQUIRE(end.state() == proto::JobState::succeeded);
  REQUIRE(watch->Exited(absl::Seconds(10)));
  const std::vector<std::string> lines = Lines(out);
  INFO("watch printed:\n" << absl::StrJoin(lines, "\n"));
  REQUIRE(WIFEXITED(watch->wait_status()));
  CHECK(WEXITSTATUS(watch->wait_status()) == 0);
  REQUIRE_FALSE(lines.empty());
  CHECK(absl::StrContains(lines.back(), absl::StrCat("succeeded iteration ", kIterations, "/", kIterations)));
  CHECK(std::set<std::string>(lines.begin(), lines.end()).size() == lines.size());  // no line twice
  for (auto& e : cluster.executors) CHECK(Stop(e.get(), absl::Seconds(5)));
}

struct Timed {
  ShellOutput out;
  double seconds = 0;
};
Timed TimedCli(const std::string& args) {
  const absl::Time start = absl::Now();
  Timed t;
  t.out = RunShell(Cli() + " " + args);
  t.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return t;
}

TEST_CASE("With Redis frozen, status, list, executors, /status and /metrics answer at once from the last known state",
          "[integration]") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  auto planner = PlannerProcess::Start((*redis)->port(), {});
  REQUIRE(planner.ok());
  const std::string address = (*planner)->address();
  const auto sim = RunSimulatedJob(address, SmallJob(2, 2, 100000, 4), absl::Milliseconds(20));
  const std::string* job = &sim->id;
  REQUIRE(Eventually([&] { return sim->ranks[0]->done >= 3; }));
  // Once through while Redis answers: the planner knows the job and executors.
  REQUIRE(TimedCli(absl::StrCat("status ", *job, " --planner ", address)).out.rc == 0);
  REQUIRE(TimedCli("executors --planner " + address).out.rc == 0);

  REQUIRE(::kill((*redis)->pid(), SIGSTOP) == 0);
  absl::SleepFor(absl::Milliseconds(500));  // stores in flight are stuck by now
  for (int round = 0; round < 3; ++round) {  // also once Redis calls time out and fail
    INFO("round " << round);
    for (const std::string& verb : {absl::StrCat("status ", *job), std::string("list"), std::string("executors")}) {
      const Timed t = TimedCli(absl::StrCat(verb, " --planner ", address));
      INFO(verb << ": " << t.out.text);
      CHECK(t.out.rc == 0);
      CHECK(t.seconds < 1.0);
      if (verb != "executors") CHECK_THAT(t.out.text, Catch::Matchers::Contains(*job));
      CHECK_THAT(t.out.text, Catch::Matchers::Contains("last known state"));
    }
    // In-process: the calls and the status endpoint within 200 ms (+ slack
    // for a loaded machine), marked stale.
    auto client = Client(address);
    absl::Time start = absl::Now();
    auto got = client->Get(*job);
    CHECK(absl::Now() - start < absl::Milliseconds(400));
    REQUIRE(got.ok());
    CHECK(got->stale_ms() > 0);
    httplib::Client http("127.0.0.1", (*planner)->http_port());
    for (const char* path : {"/status", "/metrics"}) {
      INFO(path);
      start = absl::Now();
      auto r = http.Get(path);
      CHECK(absl::Now() - start < absl::Milliseconds(400));
      REQUIRE(r);
      CHECK(r->status == 200);
      CHECK_THAT(r->body, Catch::Matchers::Contains(*job));
    }
    absl::SleepFor(absl::Milliseconds(round == 0 ? 2500 : 500));
  }
  auto metrics = httplib::Client("127.0.0.1", (*planner)->http_port()).Get("/metrics");
  REQUIRE(metrics);
  CHECK_THAT(metrics->body, !Catch::Matchers::Contains("dynapipe_state_stale_seconds 0\n"));
  ::kill((*redis)->pid(), SIGCONT);
  // Answers are fresh again once Redis is back.
  CHECK(Eventually([&] {
    auto got = Client(address)->Get(*job);
    return got.ok() && got->stale_ms() == 0;
  }));
}

TEST_CASE("A job lost with an emptied Redis: status names the loss and the iteration to resume from; list says so",
          "[integration]") {
  Stack stack = StartStack("", absl::Seconds(5));  // no append-only file: a restart loses everything
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(stack.address(), d));
  const std::string ckpt = TmpDir() + "/ckpt-lost";
  std::filesystem::remove_all(ckpt);
  auto client = Client(stack.address());
  auto job = client->Submit(TrainJob(400, ckpt, 5));
  REQUIRE(job.ok());
  REQUIRE(Eventually([&] { return checkpoint::LatestCompleteOnDisk(ckpt, 4).value_or(-1) >= 9; },
                     absl::Seconds(60)));
  REQUIRE(client->Get(*job).ok());  // the planner has seen it
  stack.redis->Stop();
  REQUIRE(stack.redis->Restart().ok());
  REQUIRE(Eventually([&] { return stack.planner->service().StatusJson().find("\"store_data_lost\":1") !=
                                  std::string::npos; }));
  // Shards still being written when the job stopped land within a moment.
  absl::SleepFor(absl::Seconds(2));
  const int64_t resume_from = checkpoint::LatestCompleteOnDisk(ckpt, 4).value_or(-1) + 1;
  const Timed status = TimedCli(absl::StrCat("status ", *job, " --planner ", stack.address()));
  INFO(status.out.text);
  CHECK(status.out.rc == 1);
  CHECK_THAT(status.out.text, Catch::Matchers::Contains(absl::StrCat("job ", *job, " was lost with the plan store's data")));
  CHECK_THAT(status.out.text, Catch::Matchers::Contains("store id "));
  CHECK_THAT(status.out.text,
             Catch::Matchers::Contains(absl::StrCat("resubmit its job file with checkpoint.resume: true to continue "
                                                    "from iteration ",
                                                    resume_from)));
  CHECK(std::count(status.out.text.begin(), status.out.text.end(), '\n') == 1);  // one line
  const Timed list = TimedCli("list --planner " + stack.address());
  INFO(list.out.text);
  CHECK(list.out.rc == 0);
  CHECK_THAT(list.out.text, Catch::Matchers::Contains("1 unfinished job(s) were lost with the plan store's data"));
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(5)));
}

}  // namespace
}  // namespace dynapipe::testing
