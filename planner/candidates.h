#pragma once

// The micro-batch splits the schedule search simulates for one batching
// method under one recomputation level. A baseline's are its sizes (every
// power of two that fits, or the configured one). Dynamic's are the DP's best
// splits, with a varlen kernel the cost-balanced splits, and every baseline's
// splits: dynamic can never be predicted slower than a method it could have
// chosen, and the simulator, not a guard, decides between them.

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/partition/balanced.h"
#include "planner/partition/batching.h"
#include "planner/planner.h"

namespace dynapipe::planner {

struct CandidateSplits {
  std::vector<std::vector<MicroBatch>> splits;
  // Dynamic's own splits (the DP's, the balanced and ramped ones) come first,
  // then the baselines' from index `own` on (for a baseline method, `own`
  // counts all its splits).
  size_t own = 0;
  // Some split was left out because a micro-batch did not fit in memory (or
  // the cost model's range): more recomputation could admit it.
  bool memory_bound = false;
};

class CandidateMaker {
 public:
  // Splits with their estimated iteration times (RampEstimate).
  using Scored = std::vector<std::pair<double, std::vector<MicroBatch>>>;

  CandidateMaker(const PlannerConfig& config, ShapeCosts& costs, std::span<const Sample> samples, Recompute r,
                 uint64_t seed);

  // FAILED_PRECONDITION when the method has no split that fits (naming the
  // method, the limit and the recomputation level); the DP's errors pass through.
  absl::StatusOr<CandidateSplits> Make(Batching b);

 private:
  // Prices `mbs` as executors compute them and keeps them if every
  // micro-batch fits on its own. False when no larger size is worth trying:
  // this one did not fit, or was a single micro-batch.
  bool Add(std::vector<MicroBatch> mbs, CandidateSplits& out);
  // A fixed-size method at every power of two that fits (or its configured size).
  void Sizes(Batching b, CandidateSplits& out);
  // The fixed-size method's split at `size` (rows, samples or x1024 tokens).
  std::vector<MicroBatch> SplitAt(Batching b, int64_t size);
  // Dynamic's varlen partitioner over micro-batch counts and edge weights,
  // the best few by RampEstimate.
  void Balanced(CandidateSplits& out);
  // Ramped splits for padded kernels (RampedRuns) around the DP's
  // micro-batch count `dp_count` per group, the best few by RampEstimate.
  void RampedPadded(int dp_count, CandidateSplits& out);
  // Prices `mbs` as executors compute them and adds them to `scored` with
  // their estimate; one that does not fit marks `out` memory-bound instead.
  void Score(std::vector<MicroBatch> mbs, Scored& scored, CandidateSplits& out);
  // The ramps tried at this depth of pipeline (none at one stage).
  std::vector<Ramp> Ramps() const;
  // A split's predicted iteration before simulation: the slowest group's
  // work plus its fill and drain; nullopt when a micro-batch does not fit.
  std::optional<double> RampEstimate(std::span<const MicroBatch> mbs);
  // The cost weights at rows of max_seq_len (computed once; nullopt when the
  // cost model cannot answer).
  const std::optional<CostWeights>& Weights();

  const PlannerConfig& config_;
  ShapeCosts& costs_;
  const std::span<const Sample> samples_;
  const Recompute r_;
  const bool ed_;
  std::vector<int> order_;
  bool weights_done_ = false;
  std::optional<CostWeights> weights_;
};

}  // namespace dynapipe::planner
