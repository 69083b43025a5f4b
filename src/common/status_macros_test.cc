#include "src/common/status_macros.h"

#include <catch2/catch.hpp>

namespace dynapipe {
namespace {

absl::Status Fails(absl::StatusCode code) { return absl::Status(code, "inner"); }

absl::Status UsesReturnIfError(absl::StatusCode code, bool* reached_end) {
  RETURN_IF_ERROR(Fails(code));
  *reached_end = true;
  return absl::OkStatus();
}

absl::StatusOr<int> MaybeInt(bool ok) {
  if (!ok) return absl::NotFoundError("no int");
  return 42;
}

absl::StatusOr<int> UsesAssignOrReturn(bool ok) {
  ASSIGN_OR_RETURN(const int x, MaybeInt(ok));
  ASSIGN_OR_RETURN(int y, MaybeInt(ok));  // two in one scope must not collide
  return x + y;
}

absl::Status StatusOrInReturnIfError(bool ok) {
  RETURN_IF_ERROR(MaybeInt(ok));
  return absl::OkStatus();
}

TEST_CASE("RETURN_IF_ERROR propagates the code and message unchanged") {
  for (auto code : {absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnavailable,
                    absl::StatusCode::kDataLoss, absl::StatusCode::kDeadlineExceeded}) {
    bool reached = false;
    const absl::Status s = UsesReturnIfError(code, &reached);
    CHECK(s.code() == code);
    CHECK(s.message() == "inner");
    CHECK_FALSE(reached);
  }
  bool reached = false;
  CHECK(UsesReturnIfError(absl::StatusCode::kOk, &reached).ok());
  CHECK(reached);
}

TEST_CASE("ASSIGN_OR_RETURN yields the value or returns the error") {
  const auto good = UsesAssignOrReturn(true);
  REQUIRE(good.ok());
  CHECK(*good == 84);
  const auto bad = UsesAssignOrReturn(false);
  CHECK(bad.status().code() == absl::StatusCode::kNotFound);
  CHECK(bad.status().message() == "no int");
  CHECK(StatusOrInReturnIfError(true).ok());
  CHECK(StatusOrInReturnIfError(false).code() == absl::StatusCode::kNotFound);
}

TEST_CASE("Annotate prefixes context and keeps the code") {
  const absl::Status s = Annotate(absl::DataLossError("bad checksum"), "plan job:1 iter 3");
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() == "plan job:1 iter 3: bad checksum");
  CHECK(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace dynapipe
