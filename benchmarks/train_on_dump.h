#pragma once

// Trains our CPU GPT stage (runtime/model/gpt.h) on a dump's micro-batches
// exactly as the executor's worker does on one rank: forwards and backwards
// in the plan's order, then the global-norm clip, AdamW and zeroed gradients
// (Worker::OptimizerStep); timed per iteration, end to end.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "benchmarks/batch_dump.h"
#include "runtime/model/layout.h"

namespace dynapipe::benchmarks {

struct TrainedIteration {
  double loss = 0;       // sum of the micro-batches' scaled losses (the global-batch mean)
  double grad_norm = 0;  // before clipping
  double seconds = 0;    // forwards + backwards + optimizer step
  int64_t real_tokens = 0;
};

// One entry per dumped iteration. The stage starts from the dump's initial
// parameters; `attention` picks the kernel.
absl::StatusOr<std::vector<TrainedIteration>> TrainOnDump(const BatchDump& dump,
                                                          runtime::model::AttentionKernel attention);

}  // namespace dynapipe::benchmarks
