#pragma once

// `dynapipe VERB [SUB] --help`: every verb's summary, usage, flags and an
// example, in one table. plan, eval and profile print their own flag lists
// (RunPlanCommand etc. with --help); the table adds their example.

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace dynapipe::cli {

struct VerbHelp {
  std::string verb;      // "submit", "data synth"
  std::string summary;   // one line, for the command list
  std::string usage;     // "dynapipe submit JOB.pbtxt [flags]"; empty: the verb prints its own
  std::vector<std::pair<std::string, std::string>> flags;  // "--planner HOST:PORT", what it does
  std::string example;
};

// Every verb and sub-verb, in the order `dynapipe --help` lists them.
const std::vector<VerbHelp>& Verbs();
const VerbHelp* FindVerb(std::string_view verb);

// True when the arguments ask for help (--help or -h anywhere before "--").
bool AsksForHelp(const std::vector<std::string>& args);

// The top-level usage: every verb's summary and the common flags.
std::string TopUsage();
// One verb's help from the table (usage, flags, example).
std::string VerbUsage(const VerbHelp& v);

}  // namespace dynapipe::cli
