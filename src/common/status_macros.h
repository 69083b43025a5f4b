#pragma once

// Status propagation for absl::Status / absl::StatusOr<T> (no exceptions cross
// our code), plus DP_CHECK for programming errors.

#include "absl/strings/string_view.h"
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DP_STATUS_CONCAT_INNER_(a, b) a##b
#define DP_STATUS_CONCAT_(a, b) DP_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                                   \
  do {                                                          \
    ::absl::Status dp_status_ = ::dynapipe::ToStatus((expr));   \
    if (!dp_status_.ok()) return dp_status_;                    \
  } while (false)

// `ASSIGN_OR_RETURN(T x, Foo());` or `ASSIGN_OR_RETURN(x, Foo());`: evaluates a
// StatusOr, returns its status on error, otherwise moves the value into `lhs`.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  DP_ASSIGN_OR_RETURN_IMPL_(DP_STATUS_CONCAT_(dp_statusor_, __LINE__), lhs, rexpr)

#define DP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace dynapipe {

inline const absl::Status& ToStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// Same code and payloads, message prefixed with `context` ("loading job.pbtxt: ...").
absl::Status Annotate(const absl::Status& status, absl::string_view context);
template <typename T>
absl::StatusOr<T> Annotate(absl::StatusOr<T> value, absl::string_view context) {
  if (value.ok()) return value;
  return Annotate(value.status(), context);
}

// Aborts with file, line and message. For broken invariants only (bugs), never
// for bad input or failed I/O.
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              absl::string_view message);

}  // namespace dynapipe

#define DP_CHECK(cond)                                                  \
  do {                                                                  \
    if (!(cond)) ::dynapipe::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (false)

#define DP_CHECK_MSG(cond, msg)                                            \
  do {                                                                     \
    if (!(cond)) ::dynapipe::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (false)
