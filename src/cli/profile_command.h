#pragma once

// `dynapipe profile`: measures the job's model on this machine's CPU backend
// and writes the cost profile its planner uses (JobSpec.cost_profile_path).

#include <iosfwd>
#include <string>
#include <vector>

namespace dynapipe::cli {

int RunProfileCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace dynapipe::cli
