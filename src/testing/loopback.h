#pragma once

// A raw client socket on loopback, for tests that talk to servers byte by byte.

#include "absl/time/time.h"

namespace dynapipe::testing {

// A socket connected to 127.0.0.1:port whose reads and writes wait at most
// `timeout`; -1 when the connection fails.
int ConnectLoopback(int port, absl::Duration timeout);

}  // namespace dynapipe::testing
