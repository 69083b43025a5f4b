#pragma once

// Process-wide logging over spdlog, set up once in each daemon's main().

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

// The distribution's Abseil has its own string_view type; let fmt (and so
// spdlog) print it like std::string_view.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(absl::string_view s, Context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

namespace dynapipe {

struct LoggingOptions {
  std::string process_name = "dynapipe";  // shown in every line
  std::string level = "info";             // trace|debug|info|warn|error|critical|off
  std::string file;                       // also log here when non-empty
};

// Installs the default logger. INVALID_ARGUMENT names a bad level.
absl::Status InitLogging(const LoggingOptions& options);

}  // namespace dynapipe
