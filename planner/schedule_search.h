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
  int permutations = 4;  // identity, tent (by work), reversed, zig-zag, then seeded shuffles
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

// Each micro-batch's cost per chunk, in the group's order: one flat table
// (micro-batch-major), so a group's costs are one allocation, not one per
// micro-batch.
struct GroupCosts {
  int chunks = 0;
  std::vector<ChunkCost> table;  // [m * chunks + c]
  int size() const { return chunks == 0 ? 0 : static_cast<int>(table.size()) / chunks; }
  const ChunkCost& At(int m, int c) const { return table[static_cast<size_t>(m) * chunks + c]; }
};
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
// per device, for any micro-batches j <= k in the order, one chain of work
// must finish: on chunk 0 the forwards up to j's, j's forward up to the last
// chunk L (with its transfers), on L every forward and backward from j's
// forward to k's backward, k's backward down to chunk 0, and there the
// backwards of k and every later one. The longest such chain, in O(M C). A
// heavy micro-batch's trip through every stage counts at each stage, which
// MakespanLowerBound's per-device work does not see. With one chunk, the
// device's work; 0 for interleaved layouts (several chunks on a device).
double OrderLowerBound(const PipelineTimes& t, std::span<const int> order);

// The orders SearchSchedule tries on one group's simulator inputs, each with
// its OrderLowerBound: made once per group, they give the group's chain
// bound before any search (a split whose bound cannot win is not searched)
// and are then searched in.
struct SearchOrders {
  std::vector<std::vector<int>> orders;
  std::vector<double> bounds;  // OrderLowerBound of each order
  double lower_bound = 0;      // the smallest: no schedule of these orders is faster
};
SearchOrders OrdersToSearch(const PipelineTimes& base, const SearchOptions& options);

// The search described above over `orders` (OrdersToSearch of `base`); an
// order whose bound is no better than the schedule in hand is not
// simulated. found = false when nothing fits in memory.
GroupSchedule SearchSchedule(const PipelineTimes& base, const SearchOrders& orders, double memory_limit_mb,
                             const SearchOptions& options);
// The same with the orders made here.
GroupSchedule SearchSchedule(const PipelineTimes& base, double memory_limit_mb, const SearchOptions& options);

}  // namespace dynapipe::planner
