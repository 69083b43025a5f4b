#pragma once

// What a binary is: the project's version (declared here, once), the commit
// it was built from (stamped by deploy/workspace_status.sh), the build type
// and whether the CUDA backend is compiled in. Every program's --version
// prints VersionLine().

#include <string>
#include "absl/strings/string_view.h"

namespace dynapipe {

inline constexpr char kVersion[] = "0.16.0";

struct BuildInfo {
  std::string version;  // kVersion
  std::string commit;   // short hash, "-dirty" when built from a modified tree, or "unknown"
  std::string build;    // "release" (NDEBUG) or "development" (assertions on)
  bool cuda = false;    // the CUDA backend is compiled in
};
const BuildInfo& GetBuildInfo();

// "PROGRAM 0.16.0 (commit 0d6141a1b2c3, release build, CUDA backend)".
std::string VersionLine(absl::string_view program);

}  // namespace dynapipe
