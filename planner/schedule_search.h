#pragma once

// Finds the fastest schedule for one data-parallel group's micro-batches:
// every applicable schedule x a few deterministic micro-batch orders, each
// simulated; keeps the fastest whose simulated peak memory fits.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/comm_model.h"
#include "planner/partition/batch.h"
#include "planner/partition/shape_costs.h"
#include "planner/schedule/schedules.h"

namespace dynapipe::planner {

struct SearchOptions {
  bool try_kind[kNumScheduleKinds] = {true, true, true};
  int permutations = 4;  // identity, reversed, zig-zag, then seeded shuffles
  uint64_t seed = 0;
};

struct GroupSchedule {
  bool found = false;
  ScheduleKind kind = ScheduleKind::kWaitFreeCyclic;
  std::vector<int> order;  // micro-batch indices in execution order
  DeviceOrders device_orders;
  double makespan_ms = 0;
  std::vector<double> peak_mb;
  int simulations = 0;
  int memory_rejections = 0;  // simulated schedules that did not fit
};

// Each micro-batch's cost per chunk, in the group's order.
using GroupCosts = std::vector<std::shared_ptr<const ShapeCost>>;
absl::StatusOr<GroupCosts> CostsOf(std::span<const MicroBatch> mbs, ShapeCosts& costs, Recompute r);

// Per-micro-batch simulator inputs for the group (index = position in `mbs`),
// from their costs (CostsOf).
PipelineTimes GroupTimes(std::span<const MicroBatch> mbs, const GroupCosts& costs, const PipelineModel& pm,
                         const CommModel& comm, int dp_rank);

// Reorders the micro-batches of `base` by `order`.
PipelineTimes Permute(const PipelineTimes& base, std::span<const int> order);

// A lower bound on any schedule's simulated makespan for a group of
// micro-batches with these costs: on each device its own work, plus the
// fastest micro-batch's forward and backward through the chunks before the
// device's first (nothing on the device can start earlier, nor its last
// backward hand on faster). Read from the costs, before any PipelineTimes is
// built: a candidate whose bound is no better than a plan in hand cannot win
// and need not be searched.
double MakespanLowerBound(const GroupCosts& costs, const PipelineModel& pm);

// A lower bound on the simulated makespan of `t`'s micro-batches run in
// `order` (indices into `t`) under every schedule above, all of which run a
// chunk's forwards in micro-batch order and its backwards too. With one chunk
// per device, two chains of work must each finish (k any micro-batch, L the
// last chunk):
// - backward through k: the first micro-batch's forward up to L, then on L
//   every forward and backward up to k's, k's backward down to chunk 1 (with
//   its transfers), then on chunk 0 the backwards of k and every later one;
// - forward through k: on chunk 0 the forwards up to k's, k's forward up to
//   L, on L every forward and backward from k's on, then the last micro-
//   batch's backward down to chunk 0.
// A heavy micro-batch's trip through every stage counts once at each stage,
// which MakespanLowerBound's per-device work does not see. 0 for interleaved
// layouts (several chunks on a device).
double OrderLowerBound(const PipelineTimes& t, std::span<const int> order);

// The smallest OrderLowerBound over the orders SearchSchedule tries.
double SearchLowerBound(const PipelineTimes& base, const SearchOptions& options);

// The search described above; an order whose OrderLowerBound is no better
// than the schedule in hand is not simulated. found = false when nothing
// fits in memory.
GroupSchedule SearchSchedule(const PipelineTimes& base, double memory_limit_mb, const SearchOptions& options);

}  // namespace dynapipe::planner
