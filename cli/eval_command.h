#pragma once

// `dynapipe eval`: per-task accuracy of a job's checkpoint on held-out data,
// beside the same model at initialisation.

#include <iosfwd>
#include <string>
#include <vector>

namespace dynapipe::cli {

int RunEvalCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace dynapipe::cli
