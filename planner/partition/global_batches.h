#pragma once

// Forming global batches from a stream of sample lengths: file order, a batch
// closes before the sample that would push its token total past the budget.
// Lengths are truncated to the maximum sequence length first.

#include <cstdint>
#include <span>
#include <vector>

#include "planner/partition/batch.h"
#include "src/data/lengths.h"

namespace dynapipe::planner {

// Decoder-only: one sequence of min(input + target, max_seq) tokens, of which
// min(target, that) are loss tokens. Encoder-decoder: each side truncated.
Sample Truncate(int64_t id, const data::RawLength& raw, int max_seq, bool encoder_decoder);

// Tokens a sample contributes to the budget.
inline int64_t SampleTokens(const Sample& s, bool encoder_decoder) {
  return s.input + (encoder_decoder ? s.target : 0);
}

// Splits `samples` (ids = positions) into global batches of at most
// `budget_tokens` tokens each (a single sample over budget forms its own batch).
std::vector<std::vector<Sample>> FormGlobalBatches(std::span<const Sample> samples, int64_t budget_tokens,
                                                   bool encoder_decoder);

}  // namespace dynapipe::planner
