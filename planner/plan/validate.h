#pragma once

// Checks a set of execution plans (all ranks of one iteration), whether just
// generated or read from disk or Redis:
//  - ranks, job, iteration and sizes agree; checksums match (DATA_LOSS if
//    not; skipped only on request, ValidateOptions::checksums);
//  - on every rank, each micro-batch's forward precedes its backward for
//    every local chunk, each exactly once;
//  - buffers: written before read, a receive finished before use, a send
//    finished before the buffer is freed, every buffer freed exactly once and
//    all free at the end;
//  - communication: co-simulating all ranks' streams (starts never block, a
//    receive finish waits for the peer's send start, a send finish for the
//    peer's receive start, gradient all-reduce waits for its group), every
//    pair's sends match the peer's receives in order, kind and shape, and no
//    rank is left waiting (no deadlock); then again under NCCL's order (each
//    run of consecutive starts one group, a rank's groups one after another,
//    a finish waiting for its whole group), so plans run on either backend;
//  - the iteration's samples appear exactly once across micro-batches and
//    equal `expected_sample_ids` when it is non-empty.
// INVALID_ARGUMENT (or DATA_LOSS) with the rank and instruction index.

#include <span>

#include "absl/status/status.h"
#include "proto/plan.pb.h"

namespace dynapipe::planner {

struct ValidateOptions {
  // Off only for plans this process sealed a moment ago (the planner's own
  // check of what it generated): their checksums were computed from the
  // same bytes.
  bool checksums = true;
};

absl::Status ValidatePlans(std::span<const proto::ExecutionPlan> plans,
                           std::span<const int64_t> expected_sample_ids = {}, const ValidateOptions& options = {});

}  // namespace dynapipe::planner
