// deploy/systemd/: the units' command lines, expanded as systemd and sh
// expand them (systemd: %i, %H, "$$" -> "$"; sh: the variables of
// dynapipe.env), run stand-in daemons that print their flags. The planner
// and every executor get the token file, the planner the Redis password
// file; nothing binds every interface; TLS flags appear exactly when the
// environment file sets them; executors get the backend and their addresses
// from it; no daemon writes a log file (the journal is the one log). And
// `systemd-analyze security` rates each unit's sandbox at most 4.0 exposure.

#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/testing/shell.h"
#include "src/testing/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using dynapipe::testing::ReadAll;
using dynapipe::testing::Runfiles;
using dynapipe::testing::RunShell;
using dynapipe::testing::ShellOutput;

std::string Shell(const std::string& command) { return RunShell(command).text; }

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size())) {
    s->replace(at, from.size(), to);
  }
}

// The unit's ExecStart with its continuation lines, specifiers and "$$"
// resolved as systemd does.
std::string ExecStart(const std::string& unit) {
  std::istringstream lines(ReadAll(Runfiles() + "/deploy/systemd/" + unit));
  std::string line, cmd;
  bool in = false;
  while (std::getline(lines, line)) {
    if (line.rfind("ExecStart=", 0) == 0) {
      in = true;
      line = line.substr(10);
    }
    if (!in) continue;
    const bool more = !line.empty() && line.back() == '\\';
    cmd += more ? line.substr(0, line.size() - 1) : line;
    if (!more) break;
  }
  ReplaceAll(&cmd, "%i", "3");
  ReplaceAll(&cmd, "%H", "node7");
  ReplaceAll(&cmd, "$$", "$");
  return cmd;
}

// The variables dynapipe.env sets, as `NAME='value'` words for env(1).
std::string EnvWords(const std::string& env_file) {
  std::istringstream lines(ReadAll(env_file));
  std::string line, words;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    words += " " + line.substr(0, eq) + "='" + line.substr(eq + 1) + "'";
  }
  return words;
}

// Runs `unit`'s command with the env file's variables (plus `extra`), the
// daemons replaced by stand-ins that print one flag per line.
std::string Flags(const std::string& unit, const std::string& extra) {
  const std::string dir = dynapipe::testing::FreshTempDir("systemd_" + unit.substr(9, 4));
  fs::create_directories(dir + "/bin");
  for (const char* daemon : {"dynapipe-planner", "dynapipe-executor"}) {
    const std::string path = dir + "/bin/" + daemon;
    std::ofstream(path) << "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n";
    fs::permissions(path, fs::perms::owner_all);
  }
  std::ofstream(dir + "/exec.sh") << ExecStart(unit) << "\n";
  return Shell("env -i PATH=/usr/bin:/bin" + EnvWords(Runfiles() + "/deploy/systemd/dynapipe.env") + extra +
               " DYNAPIPE_BIN='" + dir + "/bin' /bin/sh '" + dir + "/exec.sh'");
}

TEST_CASE("systemd units pass the token and Redis password files, bind no wildcard, and TLS only when configured") {
  for (const char* file : {"dynapipe.env", "dynapipe-planner.service", "dynapipe-executor@.service"}) {
    INFO(file);
    const std::string text = ReadAll(Runfiles() + "/deploy/systemd/" + file);
    REQUIRE_FALSE(text.empty());
    CHECK_THAT(text, !Contains("0.0.0.0") && !Contains("--insecure"));
  }
  const std::string planner = Flags("dynapipe-planner.service", "");
  INFO(planner);
  CHECK_THAT(planner, Contains("--token-file=/etc/dynapipe/token\n"));
  CHECK_THAT(planner, Contains("--redis-password-file=/etc/dynapipe/redis.password\n"));
  CHECK_THAT(planner, Contains("--http-host=127.0.0.1\n") && Contains("--listen=planner-host:50051\n"));
  CHECK_THAT(planner, !Contains("--tls"));
  CHECK_THAT(planner, !Contains("--log-file"));
  const std::string executor = Flags("dynapipe-executor@.service", "");
  INFO(executor);
  CHECK_THAT(executor, Contains("--token-file=/etc/dynapipe/token\n") && Contains("--device=3\n"));
  CHECK_THAT(executor, !Contains("--tls"));
  CHECK_THAT(executor,
             Contains("--backend=cuda\n") && Contains("--listen-address=auto\n") && Contains("--http-host=auto\n"));
  // The status port is the executor's default, 8081 + the device index.
  CHECK_THAT(executor, !Contains("--log-file") && !Contains("--http-port"));
  CHECK_THAT(Flags("dynapipe-executor@.service", " DYNAPIPE_BACKEND=cpu"), Contains("--backend=cpu\n"));

  const std::string tls = " DYNAPIPE_TLS_CERT=/etc/dynapipe/tls/p.crt DYNAPIPE_TLS_KEY=/etc/dynapipe/tls/p.key"
                          " DYNAPIPE_TLS_CA=/etc/dynapipe/tls/ca.crt";
  const std::string planner_tls = Flags("dynapipe-planner.service", tls);
  INFO(planner_tls);
  CHECK_THAT(planner_tls, Contains("--tls-cert=/etc/dynapipe/tls/p.crt\n--tls-key=/etc/dynapipe/tls/p.key\n"));
  CHECK_THAT(Flags("dynapipe-executor@.service", tls), Contains("--tls-ca=/etc/dynapipe/tls/ca.crt\n"));
}

// The overall exposure in `systemd-analyze security` output ("... Overall
// exposure level for NAME: 1.7 OK ..."; 0 best, 10 worst), -1 without one.
double OverallExposure(const std::string& analysis) {
  const size_t line = analysis.rfind("Overall exposure level for ");
  if (line == std::string::npos) return -1;
  const size_t colon = analysis.find(": ", line);
  if (colon == std::string::npos) return -1;
  const char* begin = analysis.c_str() + colon + 2;
  char* end = nullptr;
  const double exposure = std::strtod(begin, &end);
  return end == begin ? -1 : exposure;
}

// The major version of systemd-analyze on PATH ("systemd 252 (...)"), 0 when
// it cannot say.
int SystemdAnalyzeVersion() {
  const std::string out = Shell("systemd-analyze --version");
  return out.rfind("systemd ", 0) == 0 ? std::atoi(out.c_str() + 8) : 0;
}

TEST_CASE("systemd-analyze security rates each unit at most 4.0 exposure") {
  if (RunShell("command -v systemd-analyze").rc != 0) {
    WARN("skipped: systemd-analyze is not on PATH (it comes with systemd); the units' sandboxes are unchecked");
    return;
  }
  if (const int version = SystemdAnalyzeVersion(); version < 250) {
    WARN("skipped: systemd-analyze " << version << " predates security --offline (systemd 250)");
    return;
  }
  // Copies, so that the file names are the units' own (runfiles may be links).
  const std::string dir = dynapipe::testing::FreshTempDir("systemd_analyze");
  fs::create_directories(dir);
  for (const char* unit : {"dynapipe-planner.service", "dynapipe-executor@.service"}) {
    INFO(unit);
    const std::string path = dir + "/" + unit;
    fs::copy_file(Runfiles() + "/deploy/systemd/" + unit, path);
    // Offline: no systemd needs to run here, nor /etc/dynapipe or the user exist.
    const ShellOutput analysis = RunShell("SYSTEMD_COLORS=0 TMPDIR='" + dir +
                                          "' systemd-analyze security --offline=true --no-pager '" + path + "'");
    INFO(analysis.text);
    REQUIRE(analysis.rc == 0);
    const double exposure = OverallExposure(analysis.text);
    REQUIRE(exposure >= 0);
    CHECK(exposure <= 4.0);
  }
}

}  // namespace
