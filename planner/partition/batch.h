#pragma once

// Samples and micro-batches as the planner sees them (lengths only).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "planner/cost_model/layer_cost.h"

namespace dynapipe::planner {

struct Sample {
  int64_t id = 0;      // index in the dataset
  int32_t input = 0;   // tokens (decoder-only: prompt + target, already truncated)
  int32_t target = 0;  // target tokens (decoder of encoder-decoder; loss tokens of decoder-only)
};

// Where a sample sits in a micro-batch's tensors.
struct Placement {
  int32_t sample = 0;  // index into the iteration's sample list
  int32_t row = 0;
  int32_t offset = 0;
};

// A micro-batch's samples. Most micro-batches the planner weighs hold a few
// samples (a baseline's candidate splits at small sizes, the DP's long
// rows), so up to four are kept inline: planning builds ~100 candidate
// splits per iteration and most of them are never simulated.
using Placements = absl::InlinedVector<Placement, 4>;

struct MicroBatch {
  Shape shape;                  // padded tensor shape: rows x seq (x dec_seq)
  Placements samples;
  bool packed = false;          // rows hold several samples (packing baseline)
  // The data-parallel group a partitioner that balances groups chose; -1:
  // the planner splits micro-batches over groups.
  int group = -1;
};

// Tokens whose loss counts (ScoredRows: decoder-only, a target token with
// no token before it, no prompt left after truncation, is not scored).
inline int64_t LossTokens(const Sample& s, bool encoder_decoder) {
  return ScoredRows(s.input, s.target, encoder_decoder);
}

// Rounds `len` up to a multiple of `multiple` (>= 1).
inline int RoundUp(int len, int multiple) { return (len + multiple - 1) / multiple * multiple; }

}  // namespace dynapipe::planner
