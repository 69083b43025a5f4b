#pragma once

// Replays one iteration's plans (every rank) the way executors run them: each
// rank strictly in instruction order, a compute taking its simulated time, a
// send start posting at once and its data arriving a transfer's simulated
// time later, a receive or send finish waiting for that arrival, and the
// gradient all-reduce waiting for its data-parallel group. What an in-order
// executor would take if every duration were as planned, to hold the
// instruction order to the simulation that produced it.

#include <span>

#include "absl/status/statusor.h"
#include "proto/plan.pb.h"

namespace dynapipe::planner {

struct Replay {
  double makespan_ms = 0;   // the last rank's end
  double simulated_ms = 0;  // the latest simulated end in the plans
};

// INVALID_ARGUMENT when a receive has no matching send or a rank is left
// waiting (the validator's deadlock check, here with times).
absl::StatusOr<Replay> ReplayInOrder(std::span<const proto::ExecutionPlan> plans);

}  // namespace dynapipe::planner
