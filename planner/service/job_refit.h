#pragma once

// A running job's cost refit (planner/cost_model/cost_refit.h) with the
// bookkeeping around it: collects every rank's report of an iteration, joins
// them with the iteration's plans, refits, and hands out the planner built
// on the latest fit, so plans made after a refit (the planner plans
// planner_lookahead iterations ahead) use it. Keeps predicted vs measured
// iteration times for the status endpoint. Thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model/cost_refit.h"
#include "planner/planner.h"
#include "proto/job.pb.h"
#include "src/common/mutex.h"

namespace dynapipe::planner::service {

// Which cost model planned an iteration.
enum class PlanModel : uint8_t {
  kBase,     // the job's base model (before the first refit)
  kRefit,    // the latest refit
  kExplore,  // the latest refit with a larger cost per micro-batch (CostRefit::ExplorationTerms)
};

struct RefitIteration {
  int64_t iteration = 0;
  double predicted_ms = 0;  // what its plan said
  double measured_ms = 0;   // slowest rank
  bool refit_plan = false;  // planned with a refit model (kRefit or kExplore)
  // Planned to explore: its prediction is the exploration model's, off by
  // design, so it counts in no error.
  bool explore = false;
};

struct RefitStatus {
  int observed = 0;  // iterations fitted so far
  int refits = 0;
  int outliers = 0;  // left out by the last refit
  std::string model;  // the planner's cost model now
  RefitTerms terms;
  std::vector<RefitIteration> recent;  // oldest first
  // Mean |predicted - measured| / measured over the recent iterations planned
  // with the base model and with the refit one, exploring iterations left
  // out (-1: none).
  double base_error = -1, refit_error = -1;
};

class JobRefit {
 public:
  // Plans stay with `base` until the first refit.
  JobRefit(std::shared_ptr<const Planner> base, const proto::CostRefitSpec& spec);

  // The planner to plan `iteration` with (noted for the status).
  std::shared_ptr<const Planner> PlannerFor(int64_t iteration);
  // What PlannerFor handed out for `iteration` (kBase if it was not asked
  // or is no longer kept).
  PlanModel PlannedWith(int64_t iteration) const;
  // Keeps an iteration's plans (index = global rank) until its reports are in.
  void Remember(int64_t iteration, std::vector<proto::ExecutionPlan> plans);

  using FetchPlans = std::function<absl::StatusOr<std::vector<proto::ExecutionPlan>>(int64_t iteration)>;
  // Buffers `report`; once every rank's report of its iteration is in, fits
  // them with the iteration's plans (remembered, else from `fetch`). Failed
  // iterations are ignored. Errors (plans and reports that do not match) drop
  // the iteration and are returned for logging; the job goes on.
  absl::Status Report(const proto::IterationReport& report, const FetchPlans& fetch = nullptr);

  RefitStatus Status() const;

 private:
  static constexpr size_t kKeep = 64;       // iterations of reports and history kept
  // After the first refit, every other iteration of this many is planned
  // with CostRefit::ExplorationTerms (fewer, larger micro-batches).
  static constexpr int kExploreIterations = 12;
  static constexpr size_t kKeepPlans = 16;  // iterations of plans kept (older ones come from the store)

  const std::shared_ptr<const Planner> base_;
  const int world_;
  mutable Mutex mu_;
  CostRefit refit_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Planner> current_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Planner> explore_ ABSL_GUARDED_BY(mu_);  // null: not exploring
  std::shared_ptr<const Planner> explore_smaller_ ABSL_GUARDED_BY(mu_);
  int64_t explore_until_ ABSL_GUARDED_BY(mu_) = -1;  // exploring plans up to this iteration
  int observed_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, PlanModel> planned_with_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::vector<proto::ExecutionPlan>> plans_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::vector<proto::IterationReport>> reports_ ABSL_GUARDED_BY(mu_);
  std::deque<RefitIteration> history_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynapipe::planner::service
