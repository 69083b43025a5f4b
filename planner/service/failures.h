#pragma once

// Which rank caused a job's failure, judged from every failure its ranks
// reported. When a rank dies, its peers' connections to it fail; each of
// them then aborts its own communicator, so *their* peers see connections
// to live ranks fail too. Whoever reports first may be such a bystander. The
// cause is a rank others lost that did not report a failure itself.

#include <string>
#include <vector>

#include "proto/report.pb.h"

namespace dynapipe::planner::service {

struct FailureVerdict {
  bool decided = false;
  std::string error;  // the job's error when decided
};

// `failures`: reports with `error`, in arrival order. Decided at once by a
// failure that lost no peer (that rank's own error); otherwise once all
// ranks but at most one have reported, or when `final` (the planner waits no
// longer). A rank lost by others that never reported is named as the cause;
// failing that, the first report is. (Waiting for all but one matters: a
// bystander can be lost by others and report a moment later.)
FailureVerdict JudgeFailures(const std::vector<proto::IterationReport>& failures, int world, bool final);

}  // namespace dynapipe::planner::service
