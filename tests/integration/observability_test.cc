// What an operator sees of a real 2 x 2 training job (Redis, the planner's
// gRPC services, dynapipe-executor processes over Gloo): the planner's and an
// executor's /metrics pass `promtool check metrics` (skipped, saying so,
// where promtool is not installed; deploy/setup.sh installs it) and carry the
// per-job and per-rank series; once the job ends, `dynapipe history` lists
// every iteration and `dynapipe trace` writes a measured trace of one that
// the structural checker accepts.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <optional>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "cli/trace.h"
#include "src/testing/shell.h"
#include "tests/integration/control_plane_fixture.h"
#include "tests/integration/training_fixture.h"

namespace dynapipe::testing {
namespace {

using Catch::Matchers::Contains;

// `promtool check metrics` on `text`: "" when it passes, else what it said.
// Null when promtool is not installed.
std::optional<std::string> Promtool(const std::string& text, const std::string& name) {
  if (RunShell("command -v promtool").rc != 0) return std::nullopt;
  const std::string path = absl::StrCat(TmpDir(), "/", name, "-", ::getpid(), ".prom");
  std::ofstream(path) << text;
  const ShellOutput out = RunShell("promtool check metrics < '" + path + "'");
  return out.rc == 0 && out.text.empty() ? "" : absl::StrCat("rc ", out.rc, ": ", out.text);
}

// The value of the series that starts with `prefix` (name and labels), or -1.
double Sample(const std::string& text, const std::string& prefix) {
  const size_t at = text.find("\n" + prefix);
  if (at == std::string::npos) return -1;
  const size_t space = text.find(' ', at + 1 + prefix.size() - 1);
  return std::stod(text.substr(space + 1));
}

TEST_CASE("planner and executor metrics pass promtool and say how a 2 x 2 job is doing", "[integration]") {
  Stack stack = StartStack("", absl::Seconds(5));
  auto client = Client(stack.address());
  const std::string port_file = absl::StrCat(TmpDir(), "/observability-executor-", ::getpid(), ".port");
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) {
    ExecutorProcessOptions o;
    o.planner = stack.address();
    o.device = d;
    if (d == 0) o.extra = {"--http-port=0", "--port-file=" + port_file};
    executors.push_back(StartExecutor(o));
  }
  auto job = client->Submit(TrainJob(2000, TmpDir() + "/ckpt-observability", 1000));
  REQUIRE(job.ok());
  REQUIRE(Eventually([&] { return client->Get(*job).value_or(proto::JobStatus()).iterations_done() >= 4; },
                     absl::Seconds(60)));

  // The status says how the job is doing, like a training log line.
  const proto::JobStatus running = *client->Get(*job);
  CHECK(running.smoothed_loss() > 0);
  CHECK(running.tokens_per_second() > 0);
  CHECK(running.eta_s() > 0);
  CHECK(running.lr() > 0);
  CHECK(running.grad_norm() > 0);
  const ShellOutput status = RunShell(Runfiles() + "/cli/dynapipe status --planner " + stack.address());
  INFO(status.text);
  CHECK_THAT(status.text, Contains(" running   iteration ") && Contains(" | loss ") && Contains(" tokens/s | elapsed ") &&
                              Contains(" | ETA "));

  const std::string planner = stack.planner->service().MetricsText();
  INFO(planner);
  const std::string j = absl::StrCat("{job=\"", *job, "\"} ");
  CHECK(Sample(planner, "dynapipe_job_iterations" + j) == 2000);
  CHECK(Sample(planner, "dynapipe_job_iterations_completed" + j) >= 4);
  CHECK(Sample(planner, "dynapipe_job_loss" + j) > 0);
  CHECK(Sample(planner, "dynapipe_job_tokens_per_second" + j) > 0);
  CHECK(Sample(planner, "dynapipe_job_iteration_seconds" + j) > 0);
  CHECK(Sample(planner, "dynapipe_job_predicted_iteration_seconds" + j) > 0);
  const double mfu = Sample(planner, "dynapipe_job_model_flops_utilization" + j);
  CHECK((mfu > 0 && mfu < 1));
  CHECK_THAT(planner, Contains("dynapipe_build_info{version=\"") && Contains("\nprocess_cpu_seconds_total "));

  int http_port = 0;
  REQUIRE(Eventually([&] { return (std::ifstream(port_file) >> http_port) && http_port > 0; }, absl::Seconds(10)));
  httplib::Client http("127.0.0.1", http_port);
  auto got = http.Get("/metrics");
  REQUIRE(got);
  const std::string executor = got->body;
  INFO(executor);
  CHECK(Sample(executor, absl::StrCat("dynapipe_executor_iterations_total{job=\"", *job, "\",rank=\"0\",stage=\"0\"}")) >=
        1);
  CHECK_THAT(executor, Contains("dynapipe_executor_iteration_seconds_bucket{job=\"") &&
                           Contains("dynapipe_executor_peak_memory_bytes{") && Contains("dynapipe_build_info{"));

  for (const auto& [name, text] : {std::pair{"planner", planner}, std::pair{"executor", executor}}) {
    const auto verdict = Promtool(text, name);
    if (!verdict) {
      WARN("promtool is not installed (deploy/setup.sh installs it): Prometheus lint of /metrics skipped");
      break;
    }
    INFO(name << ": " << *verdict);
    CHECK(verdict->empty());
  }

  REQUIRE(client->Cancel(*job).ok());
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

TEST_CASE("history lists every iteration of a finished 2 x 2 job and trace writes a well-formed trace",
          "[integration]") {
  Stack stack = StartStack("", absl::Seconds(5));
  auto client = Client(stack.address());
  std::vector<std::unique_ptr<ChildProcess>> executors;
  for (int d = 0; d < 4; ++d) executors.push_back(StartExecutor(stack.address(), d));
  auto job = client->Submit(TrainJob(6, TmpDir() + "/ckpt-history", 100));
  REQUIRE(job.ok());
  const proto::JobStatus end = WaitEnded(client.get(), *job, absl::Seconds(120));
  INFO(end.error());
  REQUIRE(end.state() == proto::JobState::succeeded);

  auto history = client->GetIterations(*job, 0, 0);
  REQUIRE(history.ok());
  REQUIRE(history->iterations_size() == 6);
  for (int i = 0; i < 6; ++i) {
    const proto::IterationSummary& s = history->iterations(i);
    CHECK(s.iteration() == i);
    CHECK(s.loss() > 0);
    CHECK(s.iteration_ms() > 0);
    CHECK(s.predicted_iteration_ms() > 0);
    CHECK(s.tokens() > 0);
    CHECK(s.lr() > 0);
    CHECK(s.grad_norm() > 0);
  }
  CHECK(history->iterations(5).loss() == client->GetIteration(*job, 5)->reports(0).loss());
  CHECK(client->GetIterations(*job, 4, 1)->iterations(0).iteration() == 4);

  const std::string cli = Runfiles() + "/cli/dynapipe";
  const ShellOutput lines = RunShell(cli + " history " + *job + " --planner " + stack.address());
  INFO(lines.text);
  CHECK(lines.rc == 0);
  CHECK(std::count(lines.text.begin(), lines.text.end(), '\n') == 6);
  CHECK_THAT(lines.text, Contains("iteration      5 | lr "));  // 0-based, as trace --iteration
  // Ended jobs leave the default listing.
  const ShellOutput active = RunShell(cli + " status --planner " + stack.address());
  CHECK_THAT(active.text, Contains("no active jobs") && Contains("1 ended job(s) not shown"));
  const ShellOutput all = RunShell(cli + " list --all --planner " + stack.address());
  CHECK_THAT(all.text, Contains(" succeeded iteration 6/6 | loss "));
  // watch's line reads like Megatron-LM's.
  const ShellOutput watched = RunShell(cli + " watch " + *job + " --planner " + stack.address());
  INFO(watched.text);
  CHECK(watched.rc == 0);
  CHECK_THAT(watched.text, Contains(" succeeded iteration 6/6 | lr ") && Contains(" | grad norm ") &&
                               Contains(" tokens/s | ETA "));

  const std::string out = absl::StrCat(TmpDir(), "/trace-", ::getpid(), ".json");
  const ShellOutput wrote =
      RunShell(cli + " trace " + *job + " --iteration 3 --out " + out + " --planner " + stack.address());
  INFO(wrote.text);
  REQUIRE(wrote.rc == 0);
  CHECK_THAT(wrote.text, Contains("4 ranks"));
  const std::string trace = ReadAll(out);
  const absl::Status check = cli::CheckTrace(trace);
  INFO(check.message());
  CHECK(check.ok());
  // Measured slices on every rank, and arrows between the stages.
  for (int r = 0; r < 4; ++r) CHECK_THAT(trace, Contains(absl::StrCat("\"cat\":\"compute\",\"pid\":", r, ",\"tid\":1,")));
  CHECK_THAT(trace, Contains("\"ph\":\"s\"") && Contains("\"ph\":\"f\""));
  // An iteration outside the job is refused, naming the range.
  const ShellOutput bad = RunShell(cli + " trace " + *job + " --iteration 99 --planner " + stack.address());
  CHECK(bad.rc == 1);
  CHECK_THAT(bad.text, Contains("iteration: 99 is outside job"));
  for (auto& e : executors) CHECK(Stop(e.get(), absl::Seconds(15)));
}

}  // namespace
}  // namespace dynapipe::testing
