#include "src/common/logging.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "src/common/file_util.h"

namespace dynapipe {
namespace {

TEST_CASE("InitLogging rejects an unknown level and names it") {
  LoggingOptions options;
  options.level = "verbose";
  const absl::Status s = InitLogging(options);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("\"verbose\"") != std::string::npos);
}

TEST_CASE("InitLogging writes lines at or above the level to the file") {
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                           "/log_" + std::to_string(::getpid()) + ".txt";
  LoggingOptions options;
  options.process_name = "unit";
  options.level = "warn";
  options.file = path;
  REQUIRE(InitLogging(options).ok());
  spdlog::info("hidden line");
  spdlog::warn("shown line {}", 7);
  spdlog::default_logger()->flush();
  const auto text = ReadFile(path);
  REQUIRE(text.ok());
  CHECK(text->find("shown line 7") != std::string::npos);
  CHECK(text->find("unit[") != std::string::npos);
  CHECK(text->find("hidden line") == std::string::npos);
}

TEST_CASE("An INFO line reaches the log file at once (a SIGKILL right after it cannot lose it)") {
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                           "/at_once_" + std::to_string(::getpid()) + ".txt";
  LoggingOptions options;
  options.process_name = "daemon";
  options.level = "debug";
  options.file = path;
  REQUIRE(InitLogging(options).ok());
  spdlog::info("last words {}", 42);  // no explicit flush: written to the kernel before info() returns
  auto text = ReadFile(path);
  REQUIRE(text.ok());
  CHECK(text->find("last words 42") != std::string::npos);
  // DEBUG lines are not flushed one by one, but within about a second.
  spdlog::debug("detail {}", 7);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline && ReadFile(path)->find("detail 7") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(ReadFile(path)->find("detail 7") != std::string::npos);
}

}  // namespace
}  // namespace dynapipe
