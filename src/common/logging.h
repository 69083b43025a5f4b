#pragma once

// Process-wide logging over spdlog, set up once in each daemon's main().

#include <string>

#include "absl/status/status.h"

namespace dynapipe {

struct LoggingOptions {
  std::string process_name = "dynapipe";  // shown in every line
  std::string level = "info";             // trace|debug|info|warn|error|critical|off
  std::string file;                       // also log here when non-empty
};

// Installs the default logger. INVALID_ARGUMENT names a bad level.
absl::Status InitLogging(const LoggingOptions& options);

}  // namespace dynapipe
