#pragma once

// Plans one training iteration end to end: micro-batches (DynaPipe's DP or a
// baseline), data-parallel split, schedule search over recomputation levels,
// schedules and micro-batch orders, then one validated execution plan per
// rank. Pure: no I/O; safe to call from several threads at once.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/comm_model.h"
#include "planner/cost_model/pipeline_model.h"
#include "planner/partition/batching.h"
#include "planner/partition/shape_costs.h"
#include "planner/schedule/schedules.h"
#include "planner/schedule_search.h"
#include "planner/sim/simulator.h"
#include "proto/job.pb.h"
#include "proto/plan.pb.h"
#include "src/spec/job_spec.h"

namespace dynapipe::planner {

// Parts of the dynamic method that can be switched off, to measure what each
// brings (`dynapipe plan --ablate`); all on in production.
struct DynamicParts {
  // Every baseline's splits among dynamic's candidates.
  bool baselines = true;
  // The varlen partitioner: micro-batches of mixed lengths balanced by cost.
  bool balanced = true;
  // Data-parallel groups as the balancing partitioners chose them, rather
  // than split by the planner's longest-first rule.
  bool group_balance = true;
  // The chosen split's slowest and fastest data-parallel groups trade
  // micro-batches while the slowest gets faster (simulated).
  bool rebalance = true;
};

struct PlannerConfig {
  std::string job_id = "offline";
  proto::ModelSpec model;
  int pp = spec::kDefaultPp;
  int dp = spec::kDefaultDp;
  std::vector<int> layer_to_device;  // empty: equal contiguous stages
  Batching batching = Batching::kDynamic;
  int round_multiple = spec::kDefaultRoundMultiple;
  int max_seq_len = spec::kDefaultMaxSeqLen;
  int micro_batch_size = 0;       // padding / fixed_mbs; 0: best power of two
  int64_t micro_batch_tokens = 0;  // token_based; 0: best power of two x 1024
  double tolerance = spec::kDefaultCapTolerance;
  int dp_candidates = spec::kDefaultDpCandidates;  // best DP splits simulated per recomputation level
  proto::ScheduleSpec::Policy policy = proto::ScheduleSpec::auto_;
  proto::RecomputeLevel::Value recompute = proto::RecomputeLevel::auto_;
  int permutations = spec::kDefaultPermutations;
  uint64_t seed = 1;
  double memory_limit_mb = 80000;
  bool zero1 = false;
  // The executors' checkpoint copy (parameters and both moments, fp32) lives
  // in the device's memory: the job checkpoints on CPU devices, whose memory
  // is the host's (on a GPU the copy is in host memory, beside the device's).
  bool checkpoint_copy_on_device = false;
  proto::ClusterSpec cluster;
  WorkModel work;  // what executors compute of a micro-batch (from model.attention)
  DynamicParts parts;
};

// The planner's batching for a JobSpec's method; INVALID_ARGUMENT for an
// unknown one.
absl::StatusOr<Batching> BatchingOf(proto::BatchingSpec::Method m);

// The planning part of a JobSpec, after spec::NormalizeJobSpec (defaults and
// checks live there). INVALID_ARGUMENT names the offending field.
absl::StatusOr<PlannerConfig> PlannerConfigFromJob(const spec::NormalizedJobSpec& job);

struct PlanTimings {
  double partition_ms = 0, schedule_ms = 0, instructions_ms = 0, validate_ms = 0, total_ms = 0;
};

struct IterationPlan {
  int64_t iteration = 0;
  Batching batching = Batching::kDynamic;
  Recompute recompute = Recompute::kNone;
  std::vector<std::vector<MicroBatch>> groups;  // per dp group, in execution order
  std::vector<ScheduleKind> schedules;          // per dp group
  std::vector<SimResult> sims;                  // per dp group (recorded)
  double predicted_ms = 0;                      // slowest group + gradient all-reduce
  // Dynamic chose one of its own splits, not one of a baseline method's
  // (which Rebalance may then have changed).
  bool own_split = false;
  double allreduce_ms = 0;
  // Slowest data-parallel group's simulated pipeline over the mean (1: even).
  double dp_imbalance = 1;
  // The slowest group's simulated pipeline before Rebalance and after each
  // trade it kept (empty when it did not run).
  std::vector<double> rebalanced_ms;
  std::vector<double> peak_mb;                  // per pipeline stage, max over groups
  double padding_efficiency = 0;
  int64_t tokens = 0;                           // real tokens in the iteration
  int simulations = 0;
  int candidates = 0;         // splits considered
  int candidates_pruned = 0;  // of those, skipped by the makespan lower bound
  int recompute_levels_tried = 0;
  PlanTimings timings;
  std::vector<proto::ExecutionPlan> plans;      // index = global rank
};

struct PlanRequest {
  bool build_plans = true;  // instructions for every rank
  bool validate = true;     // run ValidatePlans on them
  bool record = true;       // keep per-op timings (traces)
};

class Planner {
 public:
  // FAILED_PRECONDITION if the model state alone does not fit in memory.
  static absl::StatusOr<std::unique_ptr<Planner>> Create(const PlannerConfig& config,
                                                         std::shared_ptr<const LayerCostModel> cost);

  // Plans `samples` (lengths already truncated to max_seq_len). With
  // batching `override_batching` (if set) instead of the configured one.
  absl::StatusOr<IterationPlan> Plan(std::span<const Sample> samples, int64_t iteration,
                                     const PlanRequest& request = {}) const;
  absl::StatusOr<IterationPlan> Plan(std::span<const Sample> samples, int64_t iteration, Batching batching,
                                     const PlanRequest& request) const;

  const PlannerConfig& config() const { return config_; }
  const PipelineModel& model() const { return *model_; }

  // The same planner (pipeline model, costs, every setting) stamping its
  // plans with `job_id`: a planner validated before the job had an id serves
  // the job without being built again.
  std::unique_ptr<Planner> ForJob(const std::string& job_id) const;

 private:
  Planner(PlannerConfig config, std::shared_ptr<const PipelineModel> model);

  // The schedule search's state across levels and candidates (planner.cc).
  struct Search;
  // Which data-parallel group runs each micro-batch: the partitioner's choice
  // where it made one, else longest first onto the least loaded group.
  std::vector<std::vector<int>> SplitGroups(std::span<const MicroBatch> mbs, Recompute r) const;
  // Searches recomputation level `r`; true when deeper levels cannot be faster.
  bool SearchLevel(std::span<const Sample> samples, uint64_t seed, Recompute r, Search& s) const;
  // A candidate split ready for the schedule search: its micro-batches per
  // group, their costs, and the largest group's makespan lower bound.
  struct Candidate {
    std::vector<std::vector<MicroBatch>> group_mbs;
    std::vector<GroupCosts> costs;
    std::vector<PipelineTimes> times;  // per group, once tightened (empty before)
    std::vector<SearchOrders> orders;  // per group, with times
    double bound = 0;  // no schedule search of this split can do better
    // One of dynamic's own splits (not a baseline's).
    bool own = false;
  };
  // The split's Candidate with its per-device bound (MakespanLowerBound);
  // nullopt (last_error set) when a shape has no cost.
  std::optional<Candidate> Prepare(std::vector<MicroBatch> mbs, Recompute r, Search& s) const;
  // Builds the candidate's simulator inputs and raises its bound to the
  // chain bound of the orders the search tries (OrdersToSearch).
  void Tighten(Candidate& c, const SearchOptions& options) const;
  // Schedules a candidate on every group and keeps it if fastest so far;
  // false when a group has no schedule that fits.
  bool SearchCandidate(Candidate& c, Recompute r, double allreduce, Search& s, int* memory_rejections) const;
  // Dynamic with several groups: moves or swaps micro-batches between the
  // chosen split's slowest and fastest groups, each trade searched and kept
  // only when both groups then finish before the slowest did.
  void Rebalance(Search& s) const;
  // The trade Rebalance tries: micro-batch `i` of group `a` to group `b`, and
  // `j` of `b` to `a` in its place (j < 0: a move, `i` placed at its relative
  // position). True (and `s` updated) when it was kept.
  bool TryTrade(Search& s, int a, int b, int i, int j) const;
  // The per-iteration gradient all-reduce (or measured iteration overhead).
  double AllReduceMs() const;
  // Re-simulates the chosen schedules into `best` (sims, schedules, peak memory).
  absl::Status Resimulate(const Search& s, bool record, IterationPlan& best) const;
  // Every rank's execution plan for `best`, appended to best.plans.
  void BuildPlans(std::span<const Sample> samples, int64_t iteration, IterationPlan& best) const;

  PlannerConfig config_;
  std::shared_ptr<const PipelineModel> model_;
  CommModel comm_;
  std::unique_ptr<ShapeCosts> costs_;  // shared cache, thread-safe
};

}  // namespace dynapipe::planner
