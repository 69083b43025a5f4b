#pragma once

// Gang placement: which idle executors each pending job gets. A job gets all
// of its ranks at once or none, so a job larger than what is idle takes
// nothing and waits (with a reason), and jobs after it that fit still start.
// Pure: the planner service reads the store, calls PlaceGangs, and claims
// each placement atomically (PlanStore::ClaimGang).

#include <string>
#include <vector>

namespace dynapipe::planner::service {

struct PendingJob {
  std::string id;
  int world = 1;  // ranks it needs
};

struct IdleExecutor {
  std::string id;
  std::string node;
  int device = 0;
};

struct GangPlacement {
  std::string job;
  // Executor of rank r at [r]; empty when the job must wait.
  std::vector<std::string> executors;
  // Why it waits ("" when placed), for the job's status.
  std::string waiting;
};

// Places `jobs` in the order given (submission order) on `idle`; `live` is
// how many executors are registered and heartbeating (idle or busy). A job
// that fits on one node gets the node with the fewest idle executors that
// still holds it (best fit); otherwise the nodes with the most idle
// executors first. Within a job, consecutive ranks (neighbouring pipeline
// stages) sit on the same node, in device order.
std::vector<GangPlacement> PlaceGangs(const std::vector<PendingJob>& jobs, std::vector<IdleExecutor> idle, int live);

}  // namespace dynapipe::planner::service
