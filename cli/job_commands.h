#pragma once

// `dynapipe submit | status | list | cancel | watch | history | trace | executors`: job control
// against a planner daemon. The address comes from --planner or
// $DYNAPIPE_PLANNER, the token from --token-file or $DYNAPIPE_TOKEN_FILE.

#include <iosfwd>
#include <string>
#include <vector>

#include "src/rpc/defaults.h"

namespace dynapipe::cli {

// Deadline of each call to the planner without --timeout-s.
using rpc::kDefaultCallTimeoutS;
// How long the client waits for the planner to accept a connection.
inline constexpr int kConnectTimeoutS = 2;

// Runs `command` with `args`; returns the exit status (0 ok, 1 failed call,
// 2 bad usage). Errors are one line on `err`.
int RunJobCommand(const std::string& command, const std::vector<std::string>& args, std::ostream& out,
                  std::ostream& err);

}  // namespace dynapipe::cli
