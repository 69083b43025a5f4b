// Safe deployment defaults, through the real daemons (dynapipe-planner and
// dynapipe-executor processes) and the CLI: secrets other users can read stop
// them; without a token they serve only loopback unless told --insecure; a
// status endpoint port already taken stops the second process.
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cli/job_commands.h"
#include "src/common/file_util.h"
#include "src/rpc/defaults.h"
#include "src/testing/redis_server.h"
#include "src/testing/shell.h"
#include "tests/integration/control_plane_fixture.h"

namespace dynapipe::testing {
namespace {

using Catch::Matchers::Contains;
using Output = ShellOutput;

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

std::string Planner() { return RunfilesRoot() + "/planner/service/dynapipe-planner"; }
std::string Executor() { return RunfilesRoot() + "/runtime/executor/dynapipe-executor"; }

// Runs `argv` to its end, or kills it after `limit`: a daemon that should
// refuse to start but serves instead fails the test instead of hanging it.
Output RunToExit(const std::vector<std::string>& argv, int limit_s = 20) {
  std::string command = absl::StrCat("OPENBLAS_NUM_THREADS=1 timeout -s KILL ", limit_s);
  for (const std::string& a : argv) absl::StrAppend(&command, " '", a, "'");
  return RunShell(command);  // rc 137: still running at the limit (killed)
}

// A refusal: the process exits 2 at once with exactly one line that says `want`.
void CheckRefused(const std::vector<std::string>& argv, const std::vector<std::string>& want) {
  const Output out = RunToExit(argv);
  INFO(argv[0] << " ... " << argv.back() << " -> rc " << out.rc << ": " << out.text);
  CHECK(out.rc == 2);
  CHECK(std::count(out.text.begin(), out.text.end(), '\n') == 1);
  for (const std::string& w : want) CHECK_THAT(out.text, Contains(w));
}

std::string WriteSecret(const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = absl::StrCat(TmpDir(), "/", name, "-", ::getpid());
  REQUIRE(WriteFileAtomic(path, text).ok());
  REQUIRE(::chmod(path.c_str(), mode) == 0);
  return path;
}

// An executor process on `planner` whose status endpoint is up once the
// returned port file holds its port.
struct StartedExecutor {
  std::unique_ptr<ChildProcess> process;
  std::string port_file, log_file;
  int http_port = -1;
};
StartedExecutor StartExecutor(const std::string& tag, const std::vector<std::string>& extra) {
  StartedExecutor e;
  e.port_file = absl::StrCat(TmpDir(), "/executor-", tag, "-", ::getpid(), ".port");
  e.log_file = absl::StrCat(TmpDir(), "/executor-", tag, "-", ::getpid(), ".log");
  std::vector<std::string> argv = {Executor(), "--planner=127.0.0.1:1", "--node=itest", "--http-port=0",
                                   "--log-level=warn", "--port-file=" + e.port_file, "--log-file=" + e.log_file};
  argv.insert(argv.end(), extra.begin(), extra.end());
  e.process = std::make_unique<ChildProcess>(argv, std::vector<std::pair<std::string, std::string>>{
                                                       {"OPENBLAS_NUM_THREADS", "1"}});
  Eventually([&] { return (std::ifstream(e.port_file) >> e.http_port).good(); }, absl::Seconds(20));
  return e;
}

TEST_CASE("Daemons and the CLI refuse a secret file other users can read, naming the flag, file, mode and fix") {
  const std::string open_token = WriteSecret("token-open", "t0ken\n", 0644);
  const std::string open_password = WriteSecret("password-open", "hunter2\n", 0604);
  const std::string writable_token = WriteSecret("token-writable", "t0ken\n", 0620);
  const std::vector<std::string> planner = {Planner(), "--listen=127.0.0.1:0", "--http-port=-1",
                                            "--redis=127.0.0.1:1"};
  auto with = [](std::vector<std::string> argv, const std::string& flag) {
    argv.push_back(flag);
    return argv;
  };
  CheckRefused(with(planner, "--token-file=" + open_token),
               {"--token-file: " + open_token + " has mode 0644", "chmod 600 " + open_token});
  CheckRefused(with(planner, "--token-file=" + writable_token), {writable_token + " has mode 0620"});
  CheckRefused(with(planner, "--redis-password-file=" + open_password),
               {"--redis-password-file: " + open_password + " has mode 0604", "chmod 600 " + open_password});
  CheckRefused({Executor(), "--planner=127.0.0.1:1", "--http-port=-1", "--token-file=" + open_token},
               {"--token-file: " + open_token + " has mode 0644", "chmod 600 " + open_token});
  {
    std::ostringstream out, err;
    CHECK(cli::RunJobCommand("list", {"--planner", "127.0.0.1:1", "--token-file", open_token}, out, err) == 2);
    CHECK_THAT(err.str(), Contains(open_token + " has mode 0644") && Contains("chmod 600 " + open_token));
    CHECK_THAT(err.str(), !Contains("t0ken"));
  }

  // Fixed as the message says, the same files work.
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  REQUIRE(::chmod(open_token.c_str(), 0600) == 0);
  REQUIRE(::chmod(open_password.c_str(), 0600) == 0);
  auto planner_ok = PlannerProcess::Start((*redis)->port(), {"--token-file=" + open_token});
  REQUIRE(planner_ok.ok());
  std::ostringstream out, err;
  CHECK(cli::RunJobCommand("list", {"--planner", (*planner_ok)->address(), "--token-file", open_token}, out, err) ==
        0);
  INFO(err.str());
}

TEST_CASE("Without a token a daemon serves only loopback: another address is refused naming its flag") {
  const std::string hint = "no --token-file is set";
  CheckRefused({Planner(), "--listen=0.0.0.0:0", "--http-port=-1", "--redis=127.0.0.1:1"},
               {"--listen 0.0.0.0:0 is not a loopback address", hint, "--insecure"});
  CheckRefused({Planner(), "--listen=[::]:0", "--http-port=-1", "--redis=127.0.0.1:1"}, {"--listen [::]:0", hint});
  CheckRefused({Planner(), "--listen=127.0.0.1:0", "--http-port=0", "--http-host=0.0.0.0", "--redis=127.0.0.1:1"},
               {"--http-host 0.0.0.0 is not a loopback address", hint});
  CheckRefused({Executor(), "--planner=127.0.0.1:1", "--http-port=-1", "--listen-address=0.0.0.0"},
               {"--listen-address 0.0.0.0 is not a loopback address", hint});
  CheckRefused({Executor(), "--planner=127.0.0.1:1", "--http-port=0", "--http-host=0.0.0.0"},
               {"--http-host 0.0.0.0 is not a loopback address", hint});
  CheckRefused({Executor(), "--planner=192.0.2.1:50051", "--http-port=-1"},
               {"--planner 192.0.2.1:50051 is not a loopback address", hint});
}

TEST_CASE("With --insecure a daemon serves beyond loopback without a token, warning loudly; a token needs no flag") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  const std::string log = absl::StrCat(TmpDir(), "/planner-insecure-", ::getpid(), ".log");
  auto insecure = PlannerProcess::Start(
      (*redis)->port(), {"--listen=0.0.0.0:0", "--http-host=0.0.0.0", "--insecure", "--log-file=" + log});
  REQUIRE(insecure.ok());
  CHECK_THAT(ReadAll(log), Contains("INSECURE: --listen 0.0.0.0:0 is not a loopback address") &&
                               Contains("INSECURE: --http-host 0.0.0.0 is not a loopback address"));

  const std::string token = WriteSecret("token-ok", "t0ken\n", 0600);
  const std::string log2 = absl::StrCat(TmpDir(), "/planner-token-", ::getpid(), ".log");
  auto with_token = PlannerProcess::Start(
      (*redis)->port(), {"--listen=0.0.0.0:0", "--http-host=0.0.0.0", "--token-file=" + token, "--log-file=" + log2});
  REQUIRE(with_token.ok());
  CHECK_THAT(ReadAll(log2), !Contains("INSECURE"));

  StartedExecutor e = StartExecutor("insecure", {"--listen-address=0.0.0.0", "--http-host=0.0.0.0", "--insecure"});
  REQUIRE(e.http_port > 0);
  CHECK_THAT(ReadAll(e.log_file), Contains("INSECURE: --listen-address 0.0.0.0") &&
                                      Contains("INSECURE: --http-host 0.0.0.0"));
}

TEST_CASE("An executor's status endpoint defaults to its listen address and port 8081 + its device index") {
  // A device index whose default port is free here.
  auto free_port = PickFreeLoopbackPort();
  REQUIRE(free_port.ok());
  const int device = *free_port - rpc::kExecutorStatusPortBase;
  StartedExecutor e = StartExecutor("default-port", {"--http-port=auto", absl::StrCat("--device=", device)});
  CHECK(e.http_port == *free_port);
  CHECK(RunShell(absl::StrCat("ss -ltn 'sport = :", *free_port, "'")).text.find("127.0.0.1:") != std::string::npos);
  CheckRefused({Executor(), "--planner=127.0.0.1:1", "--http-port=80a"}, {"--http-port: expected auto", "\"80a\""});
  CheckRefused({Executor(), "--planner=127.0.0.1:1", "--http-port=70000"}, {"--http-port: expected auto"});
}

TEST_CASE("A status endpoint port already taken stops the second planner or executor instead of sharing it") {
  auto redis = RedisServer::Start();
  REQUIRE(redis.ok());
  auto first = PlannerProcess::Start((*redis)->port(), {});
  REQUIRE(first.ok());
  const int taken = (*first)->http_port();
  const Output second = RunToExit({Planner(), "--listen=127.0.0.1:0", absl::StrCat("--http-port=", taken),
                                   absl::StrCat("--redis=127.0.0.1:", (*redis)->port()), "--log-level=warn"});
  INFO("second planner: rc " << second.rc << ": " << second.text);
  CHECK(second.rc == 1);
  CHECK_THAT(second.text, Contains(absl::StrCat("cannot listen on 127.0.0.1:", taken)));

  StartedExecutor a = StartExecutor("first", {});
  REQUIRE(a.http_port > 0);
  const Output b = RunToExit({Executor(), "--planner=127.0.0.1:1", absl::StrCat("--http-port=", a.http_port)});
  INFO("second executor: rc " << b.rc << ": " << b.text);
  CHECK(b.rc == 2);
  CHECK_THAT(b.text, Contains(absl::StrCat("--http-host/--http-port: status endpoint: cannot listen on 127.0.0.1:",
                                           a.http_port)));
}

}  // namespace
}  // namespace dynapipe::testing
