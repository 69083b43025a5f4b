#include "src/common/build_info.h"

#include <algorithm>
#include <ostream>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
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

bool AnswerHelpOrVersion(int argc, char** argv, absl::string_view program, absl::string_view usage, std::ostream& out) {
  const std::string name(program);
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.version_string = [name] { return VersionLine(name) + "\n"; };
  absl::SetFlagsUsageConfig(config);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--version") {
      out << VersionLine(program) << "\n";
      return true;
    }
    if (a != "--help" && a != "-h" && a != "-help") continue;
    out << usage << "\n\nflags (--name=value or --name value):\n";
    std::vector<const absl::CommandLineFlag*> flags;
    for (const auto& [flag_name, flag] : absl::GetAllFlags()) {
      // absl's own (--flagfile, --helpfull, ...) are documented by absl.
      if (absl::StartsWith(flag->Filename(), "absl/") || absl::StrContains(flag->Filename(), "/absl/")) continue;
      flags.push_back(flag);
    }
    std::sort(flags.begin(), flags.end(), [](auto* x, auto* y) { return x->Name() < y->Name(); });
    for (const absl::CommandLineFlag* f : flags) {
      out << "  --" << f->Name() << "  " << f->Help() << " (default: \"" << f->DefaultValue() << "\")\n";
    }
    out << "  --version  print the version, commit and build type\n  --help     this text\n";
    return true;
  }
  return false;
}

}  // namespace dynapipe
