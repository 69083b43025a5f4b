#include "src/common/build_info.h"

#include "absl/strings/str_cat.h"
#include "src/common/build_stamp.h"

namespace dynapipe {

const BuildInfo& GetBuildInfo() {
  static const BuildInfo info = [] {
    BuildInfo b;
    b.version = kVersion;
    b.commit = DYNAPIPE_COMMIT;
#ifdef NDEBUG
    b.build = "release";
#else
    b.build = "development";
#endif
#ifdef DYNAPIPE_WITH_CUDA
    b.cuda = true;
#endif
    return b;
  }();
  return info;
}

std::string VersionLine(absl::string_view program) {
  const BuildInfo& b = GetBuildInfo();
  return absl::StrCat(program, " ", b.version, " (commit ", b.commit, ", ", b.build, " build, ",
                      b.cuda ? "CUDA backend" : "CPU backend only", ")");
}

}  // namespace dynapipe
