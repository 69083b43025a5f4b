#include "src/common/flags.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "src/common/build_info.h"

namespace dynapipe {

std::vector<std::string> NormalizeFlagNames(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool flags_over = false;
  for (const std::string& a : args) {
    if (flags_over || a.size() <= 2 || a.rfind("--", 0) != 0) {
      out.push_back(a);
      flags_over = flags_over || a == "--";
      continue;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    std::string fixed = "--" + absl::StrReplaceAll(name.substr(2), {{"-", "_"}});
    if (eq != std::string::npos) fixed += a.substr(eq);
    out.push_back(std::move(fixed));
  }
  return out;
}

std::string DashedFlagName(absl::string_view name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }

namespace {

void PrintHelp(absl::string_view usage, std::ostream& out) {
  out << usage << "\n\nflags (--name=value or --name value):\n";
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [flag_name, flag] : absl::GetAllFlags()) {
    // absl's own (--flagfile, --helpfull, ...) are documented by absl.
    if (absl::StartsWith(flag->Filename(), "absl/") || absl::StrContains(flag->Filename(), "/absl/")) continue;
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](auto* x, auto* y) { return x->Name() < y->Name(); });
  for (const absl::CommandLineFlag* f : flags) {
    out << "  --" << DashedFlagName(f->Name()) << "  " << f->Help() << " (default: \"" << f->DefaultValue()
        << "\")\n";
  }
  out << "  --version  print the version, commit and build type\n  --help     this text\n";
}

}  // namespace

std::vector<std::string> ParseFlags(int argc, char** argv, absl::string_view program, absl::string_view usage) {
  const std::string name(program);
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.version_string = [name] { return VersionLine(name) + "\n"; };
  absl::SetFlagsUsageConfig(config);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--version") {
      std::cout << VersionLine(program) << "\n";
      std::exit(0);
    }
    if (a == "--help" || a == "-h" || a == "-help") {
      PrintHelp(usage, std::cout);
      std::exit(0);
    }
  }
  std::vector<std::string> args = NormalizeFlagNames(std::vector<std::string>(argv, argv + argc));
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(ptrs.size()), ptrs.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace dynapipe
