#pragma once

// Execution plans from a simulated schedule: one instruction stream per
// device of a data-parallel group. Every transfer's send start and receive
// start carry the same simulated instant on both devices, so each device pair
// sees its transfers in the same order (no deadlock by construction); starts
// are non-blocking, a receive finishes just before its data is used, a send
// finishes before its buffer is freed. Buffers are logical tensors mapped to
// slots by interval colouring, so slots are reused.

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model/pipeline_model.h"
#include "planner/partition/batch.h"
#include "planner/schedule/schedules.h"
#include "planner/sim/simulator.h"
#include "proto/plan.pb.h"

namespace dynapipe::planner {


struct GroupPlanInput {
  const PipelineModel* model = nullptr;
  std::span<const Sample> samples;     // the iteration's samples
  std::span<const MicroBatch> mbs;     // this group's micro-batches; index = simulator mb
  const SimResult* sim = nullptr;      // recorded simulation of `mbs`
  int dp_rank = 0;
  int dp_size = 1;
  std::string job_id;
  int64_t iteration = 0;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  Recompute recompute = Recompute::kNone;
  double predicted_iteration_ms = 0;
  int64_t global_loss_tokens = 0;  // over every group's samples
};

// One plan per pipeline device of the group (index = pp rank); global rank =
// dp_rank * pp + pp_rank. Plans are sealed (checksum set).
std::vector<proto::ExecutionPlan> BuildGroupPlans(const GroupPlanInput& in);

}  // namespace dynapipe::planner
