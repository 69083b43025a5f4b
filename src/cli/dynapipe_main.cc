// The `dynapipe` command-line client: offline planning, job control, datasets, evaluation, profiling.
#include <iostream>
#include <string>
#include <vector>

#include "src/cli/data_command.h"
#include "src/cli/eval_command.h"
#include "src/cli/job_commands.h"
#include "src/cli/plan_command.h"
#include "src/cli/profile_command.h"

int main(int argc, char** argv) {
  const std::string usage =
      "usage: dynapipe <command> [flags]\n"
      "commands:\n"
      "  plan       plan global batches offline and report (dynapipe plan --help)\n"
      "  submit     JOB.pbtxt: submit a job to the planner; prints its id\n"
      "  status     [JOB] [--json]: one job, or all\n"
      "  list       all jobs\n"
      "  cancel     JOB\n"
      "  watch      JOB: a line per iteration until the job ends\n"
      "  executors  registered executors and their assignments\n"
      "  data       synth | import | info: make and inspect training datasets (dynapipe data --help)\n"
      "  eval       per-task held-out accuracy of a job's checkpoint (dynapipe eval --help)\n"
      "  profile    measure the job's model on this CPU into a cost profile (dynapipe profile --help)\n"
      "common flags: --planner HOST:PORT ($DYNAPIPE_PLANNER), --token-file FILE ($DYNAPIPE_TOKEN_FILE),\n"
      "              --tls-ca FILE, --timeout-s N\n";
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << usage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "plan") return dynapipe::cli::RunPlanCommand(args, std::cout, std::cerr);
  if (command == "data") return dynapipe::cli::RunDataCommand(args, std::cout, std::cerr);
  if (command == "eval") return dynapipe::cli::RunEvalCommand(args, std::cout, std::cerr);
  if (command == "profile") return dynapipe::cli::RunProfileCommand(args, std::cout, std::cerr);
  for (const char* c : {"submit", "status", "list", "cancel", "watch", "executors"}) {
    if (command == c) return dynapipe::cli::RunJobCommand(command, args, std::cout, std::cerr);
  }
  std::cerr << "dynapipe: unknown command \"" << command << "\"\n" << usage;
  return 2;
}
