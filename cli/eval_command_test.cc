#include "cli/eval_command.h"

#include <catch2/catch.hpp>
#include <sstream>

namespace dynapipe::cli {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("dynapipe eval refuses a negative --iteration or --samples below 1, naming the flag, before reading files") {
  // Before: --iteration -1 evaluated the initial model and printed it as "checkpoint of iteration -1";
  // --samples 0 or -1 printed an empty table; both exited 0.
  for (const auto& [flag, value] : {std::pair{"--iteration", "-1"}, {"--iteration", "-5"}, {"--samples", "0"},
                                    {"--samples", "-1"}}) {
    INFO(flag << " " << value);
    std::ostringstream out, err;
    // The files do not exist: the flag is refused first.
    const int rc = RunEvalCommand({"--job", "/nonexistent/job.pbtxt", "--data", "/nonexistent/data", flag, value}, out,
                                  err);
    CHECK(rc == 2);
    CHECK_THAT(err.str(), Contains(std::string(flag) + ": ") && Contains(value));
    CHECK(out.str().empty());
  }
}

}  // namespace
}  // namespace dynapipe::cli
