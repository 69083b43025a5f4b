#pragma once

// `dynapipe plan`: plans every global batch of a lengths file offline (no
// daemons) and reports per iteration, or compares batching methods.

#include <iosfwd>
#include <string>
#include <vector>

namespace dynapipe::cli {

// Runs the command; results go to `out`, one-line errors to `err`. Returns
// the process exit status.
int RunPlanCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The flag reference printed by `dynapipe plan --help`.
std::string PlanUsage();

}  // namespace dynapipe::cli
