#pragma once

// Micro-batches of mixed lengths balanced by predicted cost. With a varlen
// attention kernel a micro-batch costs its tokens (the linear layers, padding
// included) and its attention pairs (the sum of n^2 over its samples), not
// its padded grid, so samples of different lengths can share rows and
// micro-batches of equal cost make even pipeline stages. Also the two packing
// baselines that balance data-parallel groups: Megatron-Core's THD packing
// with token-balanced groups, and WLB-LLM's packing balanced by a
// linear-plus-quadratic cost.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/partition/batch.h"
#include "planner/partition/shape_costs.h"

namespace dynapipe::planner {

// A sample's predicted cost on the slowest device: per_token_ms per token
// plus per_pair_ms per attention pair (Of), and per_micro_batch_ms for each
// micro-batch.
struct CostWeights {
  double per_token_ms = 0;
  double per_pair_ms = 0;
  double per_micro_batch_ms = 0;  // what a micro-batch costs beyond its tokens and pairs
  double Of(const Sample& s, bool encoder_decoder) const {
    const double enc = s.input, dec = encoder_decoder ? s.target : 0;
    return per_token_ms * (enc + dec) + per_pair_ms * enc * enc;
  }
};

// The weights `costs` implies at rows of `row_len` tokens: differences of the
// pipeline's slowest-device time between rows of one long sample, of many
// one-token samples, and two such rows. Attention pairs cost nothing extra
// unless the pipeline's work model computes only pairs inside a sample
// (varlen, decoder-only). OUT_OF_RANGE passes through from the cost model.
absl::StatusOr<CostWeights> CostWeightsOf(ShapeCosts& costs, Recompute r, int row_len, int round_multiple);

// `items` (indices into samples) as one packed micro-batch: first-fit-
// decreasing into rows of at most `max_row` tokens (each side for
// encoder-decoder models). `tight`: the row count and row length with the
// smallest grid that fits (as THD kernels see a micro-batch, padding only at
// row ends); otherwise rows of exactly max_row, as many as first-fit needs.
// Every item must be at most max_row long. Shape::cells is left 0 (ApplyWork
// sets it).
MicroBatch PackRows(std::span<const Sample> samples, std::vector<int> items, int max_row, int round_multiple,
                    bool encoder_decoder, bool tight);

// Lighter micro-batches at both ends of a group's execution order. A
// pipeline fills behind its first micro-batches' forwards and drains behind
// its last ones' backwards: a backward crosses every stage in turn, so a
// heavy micro-batch late in the order keeps the first stage busy long after
// the slowest stage is done. The drain therefore wants a longer ramp than
// the fill (backward costs about twice forward), while the middle
// micro-batches stay large enough to run efficiently.
struct Ramp {
  double edge = 1.0;  // the outermost micro-batch's weight (0 < edge <= 1)
  int length = 1;     // micro-batches at the start rising linearly from edge toward 1
  int tail = 0;       // the same at the end; 0: as `length`
  int TailLength() const { return tail > 0 ? tail : length; }
};

// Relative weights of `count` micro-batches in execution order: 1, except
// the `ramp.length` first, edge + (1 - edge) * k / length for the k-th, and
// the `ramp.TailLength()` last, the same counted from the end (the smaller
// where they overlap); all 1 below three micro-batches.
std::vector<double> RampTargets(int count, const Ramp& ramp);

// Dynamic's varlen partitioner: `groups` x `per_group` micro-batches, each
// group's in execution order, each packed tight by PackRows, weighted
// RampTargets(per_group, ramp). Samples go to groups heaviest first onto the
// lightest (loads within one sample), then within a group heaviest first to
// the micro-batch whose load over its weight is lowest once it is added.
std::vector<MicroBatch> BalancedBatches(std::span<const Sample> samples, int groups, int per_group,
                                        const CostWeights& w, int row_len, int round_multiple, bool encoder_decoder,
                                        const Ramp& ramp = {});

// The same ramps for padded kernels (materialised attention, encoder-decoder
// models), where a micro-batch costs its padded grid and should hold samples
// of similar lengths: samples go to groups by their own padded cost
// (`costs`, the slowest device; heaviest first onto the lightest group), and
// each group's, in `order` (similar lengths adjacent), is cut into
// `per_group` contiguous runs whose padded cost follows RampTargets: the
// cheapest targets on the shortest samples, each run at the position of its
// target's rank in the execution order. Empty when the group has fewer samples than
// micro-batches, or a single sample does not fit in memory.
std::vector<MicroBatch> RampedRuns(std::span<const Sample> samples, std::span<const int> order, int groups,
                                   int per_group, const Ramp& ramp, ShapeCosts& costs, Recompute r,
                                   int round_multiple);

// RampedRuns for several counts and ramps of one batch: the samples are
// dealt to groups and priced alone once, then cut for each (the same
// micro-batches as RampedRuns). `samples` and `costs` must outlive it.
class RampedRunMaker {
 public:
  RampedRunMaker(std::span<const Sample> samples, std::span<const int> order, int groups, ShapeCosts& costs,
                 Recompute r, int round_multiple);
  // `per_group` runs per group under `ramp`, as RampedRuns makes them.
  std::vector<MicroBatch> Make(int per_group, const Ramp& ramp) const;

 private:
  std::span<const Sample> samples_;
  ShapeCosts& costs_;
  Recompute r_;
  int round_multiple_;
  std::vector<std::vector<int>> of_group_;  // empty: a sample has no cost
  std::vector<double> lone_;                // per group: its samples' own costs summed
};

// Megatron-Core's balanced THD packing: samples dealt to data-parallel groups
// by tokens (longest first onto the group with fewest tokens), then each
// group's samples packed first-fit-decreasing into rows of row_len, `rows`
// rows per micro-batch.
std::vector<MicroBatch> PackingBalancedBatches(std::span<const Sample> samples, int rows, int row_len,
                                               int round_multiple, bool encoder_decoder, int groups);

// WLB-LLM's packing: micro-batches hold at most rows x row_len tokens; as
// many as packing needs, rounded up to a multiple of `groups`; samples,
// heaviest first by `w`, onto the lightest micro-batch with room (a new one
// when none has). Rows of row_len; micro-batches dealt to groups as in
// BalancedBatches.
std::vector<MicroBatch> WlbBatches(std::span<const Sample> samples, int rows, int row_len, int round_multiple,
                                   const CostWeights& w, bool encoder_decoder, int groups);

}  // namespace dynapipe::planner
