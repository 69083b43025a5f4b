#pragma once

// Runs a program to its end with a deadline, capturing what it prints: how
// the hostile-input driver runs the `dynapipe` CLI and tells a refusal from a
// crash (a signal) or a hang (still running at the deadline).

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace dynapipe::testing::hostile {

struct ProcessResult {
  bool timed_out = false;  // SIGKILLed at the deadline
  bool signaled = false;   // died of a signal of its own (not ours)
  int signal = 0;
  int exit_code = -1;      // when it exited
  std::string out, err;    // the first MB of each
  absl::Duration took;
};

// execve(argv[0], argv) with the test's environment plus `env`, stdin
// /dev/null; kills it (SIGKILL) if it runs past `limit`.
ProcessResult RunProcess(const std::vector<std::string>& argv, absl::Duration limit,
                         const std::vector<std::pair<std::string, std::string>>& env = {});

}  // namespace dynapipe::testing::hostile
