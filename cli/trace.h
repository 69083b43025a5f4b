#pragma once

// One iteration as a trace in the Chrome trace-event JSON format (which
// Perfetto and chrome://tracing open): per rank a process with four tracks,
// the measured compute and communication (the executors' instruction times)
// and the planned ones (the simulated times in the plan), flow arrows from
// each measured send to the receive that waited for it, and each rank's
// measured and planned peak memory as a counter. Measured times are from
// each rank's own start of the iteration.

#include <string>

#include "absl/status/status.h"
#include "proto/services.pb.h"

namespace dynapipe::cli {

struct TraceStats {
  int events = 0;  // slices, flows, counters and track names
  int flows = 0;   // send -> receive arrows
};

// INVALID_ARGUMENT when plans and reports do not pair up by rank.
absl::Status IterationTrace(const proto::GetIterationResponse& iteration, std::string* json, TraceStats* stats);

// The structural checks a viewer relies on: a traceEvents array whose every
// event has a phase, a name and a process; slices with a thread, ts >= 0 and
// dur >= 0; every flow id with exactly one start and one end; counters with
// numeric values; and a name for every process and thread used. The first
// problem found, naming the event.
absl::Status CheckTrace(const std::string& json);

}  // namespace dynapipe::cli
