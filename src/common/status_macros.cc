#include "src/common/status_macros.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace dynapipe {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { annotated.SetPayload(url, payload); });
  return annotated;
}

void CheckFailed(const char* file, int line, const char* condition, absl::string_view message) {
  const std::string text =
      absl::StrCat(file, ":", line, ": check failed: ", condition, message.empty() ? "" : ": ", message);
  spdlog::critical("{}", text);
  spdlog::default_logger()->flush();
  std::fprintf(stderr, "%s\n", text.c_str());
  std::abort();
}

}  // namespace dynapipe
