// What users and their schedulers see while the job rides through planner
// and Redis outages: `dynapipe watch` keeps going and ends 0 with the job's
// final line.
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/testing/redis_server.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/integration/training_fixture.h"

namespace dynapipe::testing {
namespace {

std::string Cli() { return RunfilesRoot() + "/src/cli/dynapipe"; }

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
  auto redis = RedisServer::Start(absl::Seconds(10), /*persistent=*/true);
  REQUIRE(redis.ok());
  const std::vector<std::string> flags = {"--heartbeat_timeout_ms=5000"};
  auto planner = PlannerProcess::Start((*redis)->port(), flags);
  REQUIRE(planner.ok());
  const std::string address = (*planner)->address();
  auto client = Client(address);
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(address, d));
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
  (*planner)->Signal(SIGKILL);
  REQUIRE((*planner)->Exited(absl::Seconds(5)));
  absl::SleepFor(absl::Seconds(3));
  CHECK_FALSE(watch->Exited(absl::ZeroDuration()));
  std::vector<std::string> again = flags;
  again.push_back("--listen=" + address);
  planner = PlannerProcess::Start((*redis)->port(), again);
  REQUIRE(planner.ok());
  const int64_t after_planner = client->Get(*job).ok() ? client->Get(*job)->iterations_done() : 0;
  REQUIRE(done(after_planner + 3));

  // Redis is killed and restarted from its append-only file 2 s later.
  ::kill((*redis)->pid(), SIGKILL);
  absl::SleepFor(absl::Seconds(2));
  CHECK_FALSE(watch->Exited(absl::ZeroDuration()));
  REQUIRE((*redis)->Restart().ok());

  const proto::JobStatus end = WaitEnded(client.get(), *job, absl::Seconds(180));
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
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(5)));
}

}  // namespace
}  // namespace dynapipe::testing
