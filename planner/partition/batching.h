#pragma once

// Turning an iteration's samples into micro-batches: DynaPipe's ordering + DP
// ("dynamic") and the baselines it is compared with. All methods see the same
// samples and the same cost model.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/partition/batch.h"
#include "planner/partition/dp_partitioner.h"
#include "planner/partition/shape_costs.h"
#include "src/spec/job_spec.h"

namespace dynapipe::planner {

enum class Batching {
  kDynamic = 0,
  kPacking = 1,
  kPadding = 2,
  kTokenBased = 3,
  kFixedMbs = 4,
  kPackingBalanced = 5,  // Megatron-Core: THD packing, groups balanced by tokens
  kWlb = 6,              // WLB-LLM: packing balanced by a linear-plus-quadratic cost
};
inline constexpr int kNumBatchings = 7;
const char* BatchingName(Batching b);

// Orders samples so neighbours have similar lengths: decoder-only by length;
// encoder-decoder by a nearest-neighbour tour over (input, target) starting
// from the shortest sample (ties broken by a hash of `seed` and the id).
std::vector<int> OrderSamples(std::span<const Sample> samples, bool encoder_decoder, uint64_t seed);

// Padded shape of samples[order[begin..end)] as one micro-batch, one sample per row.
Shape PaddedShape(std::span<const Sample> samples, std::span<const int> order, int round_multiple,
                  bool encoder_decoder);

// Sets each micro-batch's Shape::cells to what `work` computes of its
// samples (WorkShape) and Shape::scored to their loss tokens (the rows
// through the LM head); its grid stays.
void ApplyWork(std::span<const Sample> samples, const WorkModel& work, std::span<MicroBatch> mbs);

// Builds micro-batches from split points over `order`.
std::vector<MicroBatch> FromSplit(std::span<const Sample> samples, std::span<const int> order,
                                  std::span<const int> ends, int round_multiple, bool encoder_decoder);

struct DynamicOptions {
  int round_multiple = spec::kDefaultRoundMultiple;
  double tolerance = spec::kDefaultCapTolerance;
  int max_mbs = 0;     // 0: bounded by memory only
  int candidates = 1;  // best DP splits returned (see DpOptions::keep)
};

struct DynamicStats {
  DpResult dp;
  // Some micro-batch was left out of the DP because of memory (not because of
  // the sample count or the objective bound). If not, more recomputation
  // cannot enable a better split.
  bool memory_bound = false;
};

// The DP over `order` with micro-batch costs from `costs`. Tries the
// preferred per-micro-batch memory budget (room for one micro-batch per
// in-flight slot of 1F1B) and falls back to "one micro-batch must fit".
// FAILED_PRECONDITION names a sample that fits in no micro-batch. Returns
// up to options.candidates splits, best objective first.
absl::StatusOr<std::vector<std::vector<MicroBatch>>> DynamicBatches(std::span<const Sample> samples, std::span<const int> order,
                                                       ShapeCosts& costs, Recompute r, const DpOptions& dp,
                                                       const DynamicOptions& options, DynamicStats* stats = nullptr);

// Padding: file order, `mbs` samples per micro-batch, every sample padded to
// the longest sample of the iteration.
std::vector<MicroBatch> PaddingBatches(std::span<const Sample> samples, int mbs, int round_multiple,
                                       bool encoder_decoder);

// Packing: samples packed first-fit-decreasing into rows of `row_len` tokens
// (decoder-only: input; encoder-decoder: input and target each within the
// row length), `rows` rows per micro-batch. Attention runs over whole rows.
std::vector<MicroBatch> PackingBatches(std::span<const Sample> samples, int rows, int row_len,
                                       int round_multiple, bool encoder_decoder);

// Token-based: sorted order, a micro-batch closes before its padded token
// count (rows x padded length) would pass `budget`.
std::vector<MicroBatch> TokenBasedBatches(std::span<const Sample> samples, std::span<const int> order,
                                          int64_t budget, int round_multiple, bool encoder_decoder);

// Fixed size: sorted order, `mbs` samples per micro-batch, each padded to its own longest.
std::vector<MicroBatch> FixedBatches(std::span<const Sample> samples, std::span<const int> order, int mbs,
                                     int round_multiple, bool encoder_decoder);

// Real tokens / computed (padded) tokens over `mbs`.
double PaddingEfficiency(std::span<const Sample> samples, std::span<const MicroBatch> mbs, bool encoder_decoder);

}  // namespace dynapipe::planner
