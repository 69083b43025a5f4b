#pragma once

// The gRPC part of the hostile-input corpus: junk on the planner's gRPC port,
// missing or wrong tokens and forged executor credentials on every method,
// oversized messages and raw protobuf bodies; each counted in a Tally under
// its input surface.

#include "proto/job.pb.h"
#include "tests/hostile/planner_under_test.h"
#include "tests/hostile/tally.h"

namespace dynapipe::testing::hostile {

// GrpcWireCases() on raw connections to the gRPC port.
void FeedGrpcWire(PlannerUnderTest& p, Tally& t);
// Every method with missing or wrong tokens; executor calls with forged credentials.
void FeedGrpcAuth(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base);
// Messages over the size limit (300 MB through rpc::PlannerClient and raw), and ProtobufJunk() bodies.
void FeedGrpcSize(PlannerUnderTest& p, Tally& t, const proto::JobSpec& base);

}  // namespace dynapipe::testing::hostile
