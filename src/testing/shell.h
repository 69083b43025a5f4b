#pragma once

// Small helpers for tests that drive real programs: run a shell command and
// collect what it printed, find the runfiles tree, read a whole file.

#include <string>

namespace dynapipe::testing {

struct ShellOutput {
  int rc = -1;       // exit status; -1 when it did not exit normally
  std::string text;  // stdout and stderr
};

// Runs `command` with /bin/sh, stderr folded into stdout, to its end.
ShellOutput RunShell(const std::string& command);

// $TEST_SRCDIR/dynapipe (./dynapipe outside Bazel).
std::string Runfiles();

// The whole file; "" when it cannot be read.
std::string ReadAll(const std::string& path);

}  // namespace dynapipe::testing
