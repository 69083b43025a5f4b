// dynapipe-gpu-profile: `dynapipe profile` with the CUDA backend (default)
// and the CPU backend. Same flags as `dynapipe profile --help`.

#include <iostream>
#include <string>
#include <vector>

#include "runtime/model/profile.h"
#include "runtime/model/profile_cuda.h"
#include "cli/profile_command.h"

int main(int argc, char** argv) {
  dynapipe::cli::ProfileBackends backends;
  backends.default_device = "cuda";
  backends.by_device["cuda"] = &dynapipe::runtime::model::ProfileGptCuda;
  backends.by_device["cpu"] = &dynapipe::runtime::model::ProfileGpt;
  return dynapipe::cli::RunProfileCommand(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr,
                                          backends);
}
