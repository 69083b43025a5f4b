#pragma once

// Micro-batch tensors from a plan's placed samples and the dataset. A
// decoder-only sample of planned length L with T loss tokens is the sequence
// prompt[0 : L - T] + target[0 : T] (truncation drops the end of the prompt
// first, then of the target); position ids restart at 0 for every sample;
// the token at position p is scored with target token p + 1 for the
// positions that predict target tokens (planner::LossTokens of them).

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "src/data/dataset.h"
#include "runtime/model/layout.h"

namespace dynapipe::runtime::model {

// The most tokens (rows x seq) one micro-batch may hold: far above what fits
// a device, low enough that a corrupt plan cannot make an executor allocate
// without bound.
inline constexpr int64_t kMaxMicroBatchTokens = int64_t{1} << 26;

// INVALID_ARGUMENT when the placements overlap, leave the micro-batch's
// shape or name lengths the dataset's sample does not have; OUT_OF_RANGE for
// an id past the dataset.
absl::StatusOr<TokenBatch> BuildTokenBatch(const proto::MicroBatch& mb, const data::Dataset& dataset,
                                           int max_positions);

}  // namespace dynapipe::runtime::model
