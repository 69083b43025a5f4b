#pragma once

// Trains our GPT stage on a dump's micro-batches exactly as the executor's
// worker does on one rank: forwards and backwards in the plan's order, then
// the global-norm clip, AdamW and zeroed gradients (Worker::OptimizerStep);
// timed per iteration, end to end (on CUDA, until the device finished it).
// The stage comes from a backend (runtime/backend/backend.h): the CPU's fp32
// GptStage or the CUDA bf16 stage, behind the same model::Stage seam.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "benchmarks/batch_dump.h"
#include "runtime/backend/backend.h"
#include "runtime/model/layout.h"

namespace dynapipe::benchmarks {

struct TrainedIteration {
  double loss = 0;       // sum of the micro-batches' scaled losses (the global-batch mean)
  double grad_norm = 0;  // before clipping
  double seconds = 0;    // forwards + backwards + optimizer step
  // Host time to queue the forwards and backwards, and until the device
  // finished them (the first wait, for the loss): where the first is close
  // to the second, the host's launches set the pace (CUDA graphs would pay).
  double queue_seconds = 0;
  double compute_seconds = 0;
  int64_t real_tokens = 0;
};

// Called with the device idle before iteration `i` starts (begin) and after
// it finished (end), e.g. to trace one iteration's kernels; an error stops
// the training.
using AroundIteration = std::function<absl::Status(size_t i, bool begin)>;

// One entry per dumped iteration. The stage, made by `backend`, starts from
// the dump's initial parameters; `attention` picks the kernel.
absl::StatusOr<std::vector<TrainedIteration>> TrainOnDump(const BatchDump& dump,
                                                          runtime::model::AttentionKernel attention,
                                                          runtime::Backend& backend,
                                                          const AroundIteration& around = {});

}  // namespace dynapipe::benchmarks
