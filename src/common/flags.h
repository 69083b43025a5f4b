#pragma once

// Command-line flags of every program built on absl flags (the daemons and
// the measuring tools), in the project's one style: --dashed-names. absl
// declares names with underscores, so dashes are turned into underscores
// before absl parses; the underscore spellings keep working as aliases.

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dynapipe {

// --a-b=v -> --a_b=v and --a-b -> --a_b for every flag before "--"; values
// (the text after '=' or a separate argument) and positional arguments are
// left alone.
std::vector<std::string> NormalizeFlagNames(const std::vector<std::string>& args);

// A flag name as users write it: underscores shown as dashes.
std::string DashedFlagName(absl::string_view name);

// For a main: answers --help / -h (the usage, then every flag the program
// defines, with defaults) and --version, exiting 0; otherwise parses the
// flags (dashes or underscores) and returns the positional arguments
// (argv[0] first). Unknown flags and bad values exit 1 with absl's message.
std::vector<std::string> ParseFlags(int argc, char** argv, absl::string_view program, absl::string_view usage);

}  // namespace dynapipe
