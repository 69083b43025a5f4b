#pragma once

// Synthetic executors for tests: an iteration report of a plan as if its
// instructions ran back to back.

#include <functional>

#include "proto/plan.pb.h"
#include "proto/report.pb.h"

namespace dynapipe::planner::testing {

// `plan`'s report (job, iteration and rank from the plan) with each
// instruction timed `ms(instruction)` milliseconds, in order, one after the
// other from 0; the iteration ends `tail_ms` after the last.
proto::IterationReport TimedReport(const proto::ExecutionPlan& plan,
                                   const std::function<double(const proto::Instruction&)>& ms, double tail_ms);

}  // namespace dynapipe::planner::testing
