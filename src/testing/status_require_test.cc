#include "src/testing/status_require.h"

#include <memory>
#include <string>

namespace dynapipe::testing {
namespace {

absl::StatusOr<std::unique_ptr<std::string>> Make(bool ok) {
  if (!ok) return absl::NotFoundError("nothing here");
  return std::make_unique<std::string>("made");
}

TEST_CASE("REQUIRE_OK takes a Status or a StatusOr; ASSIGN_OR_REQUIRE declares or assigns a move-only value") {
  // (A failing REQUIRE fails the test case itself, so only the passing side
  // is checked here.)
  REQUIRE_OK(absl::OkStatus());
  REQUIRE_OK(Make(true));
  ASSIGN_OR_REQUIRE(auto made, Make(true));
  CHECK(*made == "made");
  std::unique_ptr<std::string> again;
  ASSIGN_OR_REQUIRE(again, Make(true));
  CHECK(*again == "made");
  CHECK_FALSE(Make(false).ok());
}

}  // namespace
}  // namespace dynapipe::testing
