// The `dynapipe` command-line client: offline planning, job control, datasets, evaluation, profiling.
#include <iostream>
#include <string>
#include <vector>

#include "cli/data_command.h"
#include "cli/eval_command.h"
#include "cli/export_command.h"
#include "cli/help.h"
#include "cli/job_commands.h"
#include "cli/plan_command.h"
#include "cli/profile_command.h"
#include "src/common/build_info.h"

namespace {

using dynapipe::cli::VerbHelp;

int Run(const std::string& command, const std::vector<std::string>& args) {
  if (command == "plan") return dynapipe::cli::RunPlanCommand(args, std::cout, std::cerr);
  if (command == "data") return dynapipe::cli::RunDataCommand(args, std::cout, std::cerr);
  if (command == "eval") return dynapipe::cli::RunEvalCommand(args, std::cout, std::cerr);
  if (command == "export") return dynapipe::cli::RunExportCommand(args, std::cout, std::cerr);
  if (command == "profile") return dynapipe::cli::RunProfileCommand(args, std::cout, std::cerr);
  return dynapipe::cli::RunJobCommand(command, args, std::cout, std::cerr);
}

// `dynapipe VERB [SUB] ... --help`: the verb's own flag list where it has
// one (plan, eval, profile), else the table's; then the example.
int Help(const std::string& command, const std::vector<std::string>& args) {
  const VerbHelp* verb = dynapipe::cli::FindVerb(command);
  if (command == "data" && !args.empty()) {
    if (const VerbHelp* sub = dynapipe::cli::FindVerb("data " + args[0])) verb = sub;
  }
  if (!verb->usage.empty()) {
    std::cout << dynapipe::cli::VerbUsage(*verb);
    return 0;
  }
  if (const int rc = Run(command, {"--help"}); rc != 0) return rc;
  std::cout << "example:\n  " << verb->example << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty()) {
    std::cerr << dynapipe::cli::TopUsage();
    return 2;
  }
  const std::string& command = all[0];
  if (command == "--version" || command == "version") {
    std::cout << dynapipe::VersionLine("dynapipe") << "\n";
    return 0;
  }
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << dynapipe::cli::TopUsage();
    return 0;
  }
  const std::vector<std::string> args(all.begin() + 1, all.end());
  if (dynapipe::cli::FindVerb(command) == nullptr) {
    std::cerr << "dynapipe: unknown command \"" << command << "\" (dynapipe --help lists them)\n";
    return 2;
  }
  if (dynapipe::cli::AsksForHelp(args)) return Help(command, args);
  return Run(command, args);
}
