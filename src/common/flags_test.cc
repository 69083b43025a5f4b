#include "src/common/flags.h"

#include <catch2/catch.hpp>

namespace dynapipe {
namespace {

TEST_CASE("flag names: dashes become absl's underscores, values and positionals stay", "[flags]") {
  const std::vector<std::string> in = {"prog",         "--http-port=-1", "--token-file", "/etc/a-b/token",
                                       "--log_level",  "info",           "-h",           "pos-arg",
                                       "--planner=host-a:1,host-b:2",    "--",           "--not-a-flag"};
  const std::vector<std::string> want = {"prog",        "--http_port=-1", "--token_file", "/etc/a-b/token",
                                         "--log_level", "info",           "-h",           "pos-arg",
                                         "--planner=host-a:1,host-b:2",   "--",           "--not-a-flag"};
  CHECK(NormalizeFlagNames(in) == want);
  CHECK(DashedFlagName("comm_timeout_s") == "comm-timeout-s");
}

}  // namespace
}  // namespace dynapipe
