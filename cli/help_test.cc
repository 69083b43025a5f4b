#include <catch2/catch.hpp>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/args.h"
#include "cli/help.h"
#include "src/common/build_info.h"
#include "src/testing/shell.h"

namespace dynapipe::cli {
namespace {

std::string Bin(const std::string& path) { return testing::Runfiles() + "/" + path; }

TEST_CASE("every verb and sub-verb answers --help with its usage, flags and an example (exit 0)", "[cli]") {
  const std::string dynapipe = Bin("cli/dynapipe");
  int verbs = 0;
  for (const VerbHelp& v : Verbs()) {
    for (const char* flag : {"--help", "-h"}) {
      const auto r = testing::RunShell(absl::StrCat(dynapipe, " ", v.verb, " ", flag));
      INFO(v.verb << " " << flag << ": " << r.text);
      CHECK(r.rc == 0);
      CHECK(absl::StrContains(r.text, "usage"));
      CHECK(absl::StrContains(r.text, "example:\n  dynapipe " + v.verb.substr(0, v.verb.find(' '))));
      for (const auto& [name, text] : v.flags) CHECK(absl::StrContains(r.text, name.substr(0, name.find(' '))));
    }
    ++verbs;
  }
  CHECK(verbs == 16);  // 13 verbs and data's three sub-verbs
  // After other arguments too, and never read as an argument.
  for (const char* cmd : {"data info --help", "status job-x --help", "plan --lengths x --help", "eval --help", "export --help",
                          "profile --job x --help", "submit configs/jobs/quickstart.pbtxt --help"}) {
    const auto r = testing::RunShell(absl::StrCat(dynapipe, " ", cmd));
    INFO(cmd << ": " << r.text);
    CHECK(r.rc == 0);
    CHECK(absl::StrContains(r.text, "example:"));
  }
  // The top level lists every verb.
  const auto top = testing::RunShell(dynapipe + " --help");
  CHECK(top.rc == 0);
  for (const VerbHelp& v : Verbs()) {
    if (v.verb.find(' ') == std::string::npos) CHECK(absl::StrContains(top.text, "  " + v.verb + " "));
  }
  const auto unknown = testing::RunShell(dynapipe + " sumbit");
  CHECK(unknown.rc == 2);
  CHECK(absl::StrContains(unknown.text, "unknown command \"sumbit\""));
}

TEST_CASE("--version on the client and both daemons names the version, commit and build", "[cli]") {
  const std::regex line(
      R"((dynapipe|dynapipe-planner|dynapipe-executor) (\S+) \(commit ([0-9a-f]{12}(-dirty)?|unknown), (release|development) build, (CUDA backend|CPU backend only)\)\n)");
  for (const char* path : {"cli/dynapipe", "planner/service/dynapipe-planner", "runtime/executor/dynapipe-executor"}) {
    const auto r = testing::RunShell(Bin(path) + " --version");
    INFO(path << ": " << r.text);
    CHECK(r.rc == 0);
    std::smatch m;
    REQUIRE(std::regex_match(r.text, m, line));
    CHECK(absl::EndsWith(path, m[1].str()));
    CHECK(m[2].str() == kVersion);
    CHECK(m[3].str() == GetBuildInfo().commit);
  }
}

TEST_CASE("the client and the planner start without CUDA libraries; the executor has the CUDA backend", "[cli]") {
  for (const char* path : {"cli/dynapipe", "planner/service/dynapipe-planner"}) {
    const auto r = testing::RunShell("ldd " + Bin(path));
    INFO(path << ": " << r.text);
    CHECK(r.rc == 0);
    for (const char* lib : {"libcudart", "libcublas", "libnccl"}) CHECK(!absl::StrContains(r.text, lib));
  }
  // --backend cuda reaches the CUDA backend where the build has it: here it
  // fails for want of a device (on a GPU machine, for want of a planner).
  const auto r = testing::RunShell("timeout 60 " + Bin("runtime/executor/dynapipe-executor") +
                                   " --backend=cuda --planner=127.0.0.1:1");
  INFO(r.text);
  CHECK(r.rc != 0);
  CHECK(absl::StrContains(r.text, "has no CUDA backend") == !GetBuildInfo().cuda);
}

TEST_CASE("the daemons answer --help with their usage and flags (exit 0)", "[cli]") {
  for (const auto& [path, flag] : std::vector<std::pair<std::string, std::string>>{
           {"planner/service/dynapipe-planner", "--listen"}, {"runtime/executor/dynapipe-executor", "--device"}}) {
    for (const char* help : {"--help", "-h"}) {
      const auto r = testing::RunShell(Bin(path) + " " + help);
      INFO(path << " " << help << ": " << r.text);
      CHECK(r.rc == 0);
      CHECK(absl::StrContains(r.text, "example: dynapipe-"));
      CHECK(absl::StrContains(r.text, "  " + flag + "  "));
      CHECK(absl::StrContains(r.text, "--version"));
      CHECK(!absl::StrContains(r.text, "never called"));
      CHECK(!absl::StrContains(r.text, "--flagfile"));  // absl's own flags stay out
    }
  }
}

}  // namespace
}  // namespace dynapipe::cli

namespace dynapipe::cli {
namespace {

TEST_CASE("one flag style: dashed names everywhere, underscore spellings accepted", "[cli]") {
  // The client.
  auto a = Args::Parse({"--token_file", "t", "--timeout-s=3", "--max_tokens=9"}, {"token-file", "timeout-s", "max-tokens"},
                       {});
  REQUIRE(a.ok());
  CHECK(a->Str("token-file") == "t");
  CHECK(a->Str("max-tokens") == "9");
  CHECK(!Args::Parse({"--tokenfile", "t"}, {"token-file"}, {}).ok());
  // The daemons: their help shows dashes, and a dashed name reaches its flag
  // (a bad value is reported against the flag, not as an unknown flag).
  for (const auto& [path, flag] : std::vector<std::pair<std::string, std::string>>{
           {"planner/service/dynapipe-planner", "heartbeat-timeout-ms"},
           {"runtime/executor/dynapipe-executor", "comm-timeout-s"}}) {
    const auto help = testing::RunShell(Bin(path) + " --help");
    CHECK(absl::StrContains(help.text, "  --" + flag + "  "));
    CHECK(!absl::StrContains(help.text, "--token_file"));
    const auto bad = testing::RunShell(Bin(path) + " --" + flag + "=soon");
    INFO(bad.text);
    CHECK(bad.rc != 0);
    CHECK(absl::StrContains(bad.text, "soon"));
    CHECK(!absl::StrContains(bad.text, "Unknown command line flag"));
    const auto unknown = testing::RunShell(Bin(path) + " --no-such-flag=1");
    CHECK(unknown.rc != 0);
    CHECK(absl::StrContains(unknown.text, "no_such_flag"));
  }
}

}  // namespace
}  // namespace dynapipe::cli

namespace dynapipe::cli {
namespace {

TEST_CASE("a planner that is down is reported within seconds, naming the address and where it came from", "[cli]") {
  const std::string dynapipe = Bin("cli/dynapipe");
  const absl::Time start = absl::Now();
  const auto r = testing::RunShell("env -u DYNAPIPE_PLANNER -u DYNAPIPE_TOKEN_FILE " + dynapipe +
                                   " list --planner 127.0.0.1:1");
  const absl::Duration took = absl::Now() - start;
  INFO(r.text);
  CHECK(r.rc == 1);
  CHECK(took < absl::Seconds(5));  // not the 10 s call deadline
  CHECK(absl::StrContains(r.text, "cannot reach the planner at 127.0.0.1:1 within 2s (from --planner)"));
  const auto env = testing::RunShell("env -u DYNAPIPE_TOKEN_FILE DYNAPIPE_PLANNER=127.0.0.1:1 " + dynapipe + " status");
  CHECK(absl::StrContains(env.text, "(from $DYNAPIPE_PLANNER)"));
  // A token file that cannot be read names the setting that named it.
  const auto token = testing::RunShell("DYNAPIPE_TOKEN_FILE=/nonexistent/token " + dynapipe + " list");
  CHECK(token.rc == 2);
  CHECK(absl::StrContains(token.text, "$DYNAPIPE_TOKEN_FILE: "));
  const auto flag = testing::RunShell(dynapipe + " list --token_file /nonexistent/token");
  CHECK(absl::StrContains(flag.text, "--token-file: "));
}

}  // namespace
}  // namespace dynapipe::cli
