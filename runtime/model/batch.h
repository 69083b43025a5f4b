#pragma once

// Micro-batch tensors from a plan's placed samples and the dataset. A
// decoder-only sample of planned length L with T loss tokens is the sequence
// prompt[0 : L - T] + target[0 : T] (truncation drops the end of the prompt
// first, then of the target); position ids restart at 0 for every sample;
// the token at position p is scored with target token p + 1 for the
// positions that predict target tokens (planner::LossTokens of them).
//
// An encoder-decoder sample (model.kind t5) of planned lengths L / T puts
// input[0 : L] in the encoder grid (rows x seq_len) at its offset, and in
// the decoder grid (rows x dec_seq_len) the decoder's input [pad] +
// target[0 : T - 1] scored against target[0 : T] (pad starts the decoder, as
// in T5), in the same row and segment; a row's samples take the decoder grid
// one after another in the order the plan lists them.

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
                                           int max_positions, bool encoder_decoder = false);

}  // namespace dynapipe::runtime::model
