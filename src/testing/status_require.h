#pragma once

// Catch2 checks on absl::Status and absl::StatusOr that print the status
// when they fail (a bare REQUIRE(x.ok()) says only "false"):
//
//   REQUIRE_OK(store.PutJob(job));                 // a Status or a StatusOr
//   ASSIGN_OR_REQUIRE(auto plan, store.GetPlan(j, 0, 0));

#include <catch2/catch.hpp>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dynapipe::testing::internal {

inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace dynapipe::testing::internal

#define REQUIRE_OK(expr)                                                        \
  do {                                                                          \
    const auto& dp_require_ok_ = (expr);                                        \
    INFO(::dynapipe::testing::internal::StatusOf(dp_require_ok_).ToString());   \
    REQUIRE(::dynapipe::testing::internal::StatusOf(dp_require_ok_).ok());      \
  } while (false)

#define DP_REQUIRE_CONCAT_INNER(a, b) a##b
#define DP_REQUIRE_CONCAT(a, b) DP_REQUIRE_CONCAT_INNER(a, b)
#define DP_ASSIGN_OR_REQUIRE_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  REQUIRE_OK(tmp);                                \
  lhs = std::move(*tmp)

// Declares or assigns `lhs` from a StatusOr's value; REQUIREs it OK first.
#define ASSIGN_OR_REQUIRE(lhs, expr) DP_ASSIGN_OR_REQUIRE_IMPL(DP_REQUIRE_CONCAT(dp_status_or_, __LINE__), lhs, expr)
