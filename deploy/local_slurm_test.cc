// deploy/slurm/dynapipe.sbatch on a real one-node Slurm: the script
// deploy/slurm/local-slurm-test.sh starts munged, slurmctld and slurmd on
// loopback in a private directory and trains tiny CPU jobs through sbatch
// (without GPUs, and with GPU requests that must not leak into the steps).
// Needs root and Debian's slurmctld/slurmd/munge (deploy/setup.sh installs
// them); elsewhere it says why it did not run.

#include <catch2/catch.hpp>
#include <string>

#include "src/testing/shell.h"

namespace {

using Catch::Matchers::Contains;
using dynapipe::testing::Runfiles;

TEST_CASE("The sbatch script trains to completion on a real local slurmctld + slurmd") {
  const std::string command = "cd '" + Runfiles() + "' && DYNAPIPE_BIN='" + Runfiles() +
                              "' DYNAPIPE_SLURM_TEST_TIMEOUT_S=240 bash deploy/slurm/local-slurm-test.sh";
  const dynapipe::testing::ShellOutput out = dynapipe::testing::RunShell(command);
  if (out.rc == 77) {
    WARN(out.text);  // not root, or no Slurm here: nothing was tested
    return;
  }
  INFO(out.text);
  CHECK(out.rc == 0);
  CHECK_THAT(out.text, Contains("local-slurm-test: PASS"));
}

}  // namespace
