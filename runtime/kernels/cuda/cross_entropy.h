#pragma once

// Fused softmax + cross-entropy over target tokens: one pass finds each row's
// max and sum of exponentials (online), a second one (only when a gradient is
// asked for) adds the gradient; probabilities are never stored. The launcher
// is asynchronous on `stream` and returns the launch status.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dynapipe::runtime::cuda {

// For each row i with targets[i] >= 0 ("scored"):
//   row_loss[i] = scale * -log softmax(logits[i])[targets[i]]
//   dlogits[i, :] += scale * (softmax(logits[i]) - onehot(targets[i]))
// Rows with targets[i] < 0 get row_loss[i] = 0 and leave dlogits unchanged.
// Then *loss_sum += sum_i row_loss[i], summed in a fixed order by one block,
// so the loss is bitwise deterministic. `scale` is 1 / (target tokens of the
// whole global batch), as in the CPU backend. Targets must be < V; a row
// whose target is >= V gets a NaN loss and no gradient (the CPU backend does
// not check). dlogits may be null (loss only); with logits, the gradient is
// read, added in fp32 and rounded once. dlogits must not overlap logits.
absl::Status SoftmaxCrossEntropy(float* loss_sum,                 // (1), +=
                                 float* row_loss,                 // (N) scratch, written
                                 __nv_bfloat16* dlogits,          // (N, V), += or null
                                 const __nv_bfloat16* logits,     // (N, V)
                                 const int32_t* targets,          // (N), < 0: ignored
                                 float scale, int64_t N, int64_t V, cudaStream_t stream);

}  // namespace dynapipe::runtime::cuda
