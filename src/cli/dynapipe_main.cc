// The `dynapipe` command-line client. Subcommands: plan (offline planning).
#include <iostream>
#include <string>
#include <vector>

#include "src/cli/plan_command.h"

int main(int argc, char** argv) {
  const std::string usage =
      "usage: dynapipe <command> [flags]\n"
      "commands:\n"
      "  plan    plan global batches offline and report (dynapipe plan --help)\n";
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << usage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "plan") return dynapipe::cli::RunPlanCommand(args, std::cout, std::cerr);
  std::cerr << "dynapipe: unknown command \"" << command << "\"\n" << usage;
  return 2;
}
