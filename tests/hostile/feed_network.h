#pragma once

// The stored-state and HTTP part of the hostile-input corpus: plans
// overwritten in Redis and bad FetchPlan requests, and malformed HTTP for the
// status endpoint; each counted in a Tally under its input surface.

#include "proto/job.pb.h"
#include "tests/hostile/planner_under_test.h"
#include "tests/hostile/tally.h"

namespace dynapipe::testing::hostile {

// Two jobs get their first plans; their stored bytes are then replaced
// (garbage, truncated, flipped, another key's plan, deleted) and fetched.
void FeedStoredPlans(PlannerUnderTest& p, Tally& t, int redis_port, const proto::JobSpec& base);
// HttpCases() on raw connections to the status endpoint; stalls 8 at a time.
void FeedHttp(PlannerUnderTest& p, Tally& t);

}  // namespace dynapipe::testing::hostile
