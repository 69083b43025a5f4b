#pragma once

// An encoder-decoder's tensors held by several pipeline stages (wte: the
// first stage, the stage where the decoder starts, a tied head's last; each
// stack's relative bias table: every stage with a layer of that stack) get
// the sum of every copy's gradient, so that every copy takes the same step.
// The whole pipeline of one data-parallel group sums each tensor in a fixed
// order, stages without a copy adding zeros, so no rank needs to know where
// the others' layers lie. (A decoder-only model's tied embedding is summed
// by Worker::ExchangeTiedEmbedding, between the pipeline's two ends.)

#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/backend/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/model/stage.h"

namespace dynapipe::runtime::executor {

// `pipeline`: the global ranks of this rank's pipeline, every one of which
// makes the same call; `chunks`: this rank's stages. Under ZeRO-1 (`dp` > 1
// members, this rank member `dp_rank`) only this rank's shard of each tensor
// (its own ownership region, grad_reducer.h) is summed.
absl::Status SumSharedTensors(std::span<const std::unique_ptr<model::Stage>> chunks, std::span<const int> pipeline,
                              Backend* backend, comm::Communicator* comm, absl::Time deadline, int dp = 1,
                              int dp_rank = 0);

}  // namespace dynapipe::runtime::executor
